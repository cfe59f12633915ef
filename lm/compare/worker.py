"""A job worker of ``lm compare --jobs N`` (:mod:`lm.compare.jobs`), run as ``python -m
lm.compare.worker``: it trains the runs it is given one after another in this process, so that it
pays its start (imports) once.

Each line on standard input is the JSON list of one run's ``lm train`` arguments as a sweep
writes them (the config, ``--out``, ``--resume`` or ``--overwrite``, ``--init-from``, ``--set``,
``--quiet``), and ``--measure SPEC``: once trained, measure the run as the sweep's report will
(:func:`lm.compare.measure.measure_job`). The run trains as ``python -m lm train ARGS`` would,
and its ``run.json`` records that command. The worker answers each run with its exit status,
``{"code": N}``, one line on standard output; what the run says goes to standard error, an
error in one line. End of input ends the worker; Ctrl-C while it waits, too.

``python -m lm.compare.worker WIDEN_FILE``: on SIGUSR1 the run training now takes the CPU threads
the file names (cores another job has given back: a run's numbers do not depend on its thread
count). The worker says ``{"ready": true}`` first, once it hears the signal: before that the
signal's default would end it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Any

from lm.compare.measure import measure_job
from lm.config.errors import LMError, one_line
from lm.config.load import load_config
from lm.runs.directory import check_out_dir

# What run.json records as the program: the run trains as `python -m lm train ARGS` would.
LM_MAIN = str(Path(__file__).resolve().parent.parent / "__main__.py")


def _parser() -> argparse.ArgumentParser:
    """The ``lm train`` arguments a sweep gives its jobs (:func:`lm.compare.sweep` writes them)."""
    parser = argparse.ArgumentParser(prog="lm train")
    parser.add_argument("config")
    parser.add_argument("--out", required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[])
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--measure", metavar="SPEC")
    parser.add_argument("--init-from")
    return parser


_WIDENED: list[int] = []
"""The threads the worker was last told to take (by :func:`_widen_from`'s handler) in this job."""


def _widen_from(path: Path) -> Any:
    """A SIGUSR1 handler: take the threads ``path`` names (it runs between two of the job's
    operations, in the thread that starts them)."""

    def widen(signum: int, frame: Any) -> None:
        import torch

        try:
            threads = int(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if threads >= 1:
            torch.set_num_threads(threads)
            _WIDENED[:] = [threads]

    return widen


def train_job(argv: list[str]) -> int:
    """Train (then measure) one run of ``argv``; its exit status, as ``lm train``'s."""
    from lm.training.loop import train

    _WIDENED.clear()

    try:
        args = _parser().parse_args(argv)
        config = load_config(args.config, args.overrides)
        out = check_out_dir(Path(args.out))
        result = train(
            config,
            out,
            resume=args.resume,
            overwrite=args.overwrite,
            quiet=True,
            init_from=args.init_from,
        )
        code = {"done": 0, "target": 0, "interrupted": 130}.get(result.status, 1)
        if result.message:
            print(f"lm: {one_line(result.message)}", file=sys.stderr)
        if code == 0 and args.measure is not None:
            measure_job(out, args.measure, threads=_WIDENED[0] if _WIDENED else None)
        return code
    except SystemExit as e:  # argparse's refusal of the arguments, said on standard error
        return e.code if isinstance(e.code, int) else 2
    except LMError as e:
        print(f"lm: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        said = f"; {one_line(str(e))}" if str(e) else ""
        print(f"lm: interrupted{said}", file=sys.stderr)
        return 130


def main() -> int:
    if sys.stdin.isatty():
        print(
            "lm: error: lm compare --jobs runs this itself, with runs on its input", file=sys.stderr
        )
        return 2
    from lm.training.optim import without_dynamo_import

    without_dynamo_import()
    answers = sys.stdout
    if len(sys.argv) > 1 and hasattr(signal, "SIGUSR1"):  # not on Windows
        signal.signal(signal.SIGUSR1, _widen_from(Path(sys.argv[1])))
        answers.write(json.dumps({"ready": True}) + "\n")
        answers.flush()
    try:
        for line in sys.stdin:
            argv = json.loads(line)
            sys.argv = [LM_MAIN, "train", *argv]  # what the run's record says ran
            with contextlib.redirect_stdout(sys.stderr):  # standard output is the answers
                code = train_job(argv)
            answers.write(json.dumps({"code": code}) + "\n")
            answers.flush()
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
