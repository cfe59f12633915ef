"""A job slot of ``lm compare --jobs N``: one process that trains the sweep's runs it is given,
one after another (``python -m lm.compare.worker``).

A process of its own per run would pay its start every time (importing torch and lm, a second
or more of PyTorch's own imports); a slot pays it once. Each line on standard input is the JSON
list of one run's ``lm train`` arguments; the slot runs ``lm train`` with them in this process,
as ``python -m lm train ARGS`` would (``sys.argv`` too, which the run's ``run.json`` records),
and answers with one line on standard output, ``{"code": N}``, its exit status. What ``lm
train`` says goes to standard error. End of input ends the slot.

Signals are ``lm train``'s: SIGINT or SIGTERM during a run ask it for a checkpoint, and it ends
with status 130. A slot waiting for its next run ends quietly on Ctrl-C (the terminal signals
every process of the sweep) and by the default action of SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path


def serve() -> int:
    import lm
    from lm.cli import main

    answers = sys.stdout
    command = str(Path(lm.__file__).resolve().parent / "__main__.py")  # python -m lm's argv[0]
    try:
        for line in sys.stdin:
            args = ["train", *json.loads(line)]
            sys.argv = [command, *args]
            # Anything lm train prints goes to standard error: standard output is the answers.
            with contextlib.redirect_stdout(sys.stderr):
                try:
                    code = main(args)
                except SystemExit as e:  # argparse's refusal of the arguments
                    code = e.code if isinstance(e.code, int) else 2
            answers.write(json.dumps({"code": code}) + "\n")
            answers.flush()
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(serve())
