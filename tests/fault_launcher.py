"""``python tests/fault_launcher.py FAULT ARGS...``: the ``lm`` command (``lm ARGS...``) with one
fault injected from outside into one process of a ``torchrun`` job, so that a test can check
that every other process stops too (instead of waiting for it in a collective):

- ``write-fails-on-rank0``: rank 0's checkpoint writes fail as on a full disk;
- ``signal-on-rank1``: rank 1 receives SIGTERM during its third step;
- ``no-checkpoint-on-rank1``: rank 1 sees no checkpoint in the run directory (a second machine
  without the shared filesystem).

With ``LM_TEST_RANK0_DONE`` naming a FIFO, every other rank waits, once ``lm`` has returned, for
rank 0 to say on it that its own ``lm`` has returned (its line printed): torchrun ends the
others soon after one process exits, and a rank 1 that left first could have rank 0 ended
before it printed.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from typing import Any

import lm.runs.checkpoint
import lm.training.loop
from lm.cli import main
from lm.data.batches import TrainBatches

RANK = int(os.environ.get("RANK", "0"))


def failing_write(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


if __name__ == "__main__":
    fault = sys.argv[1]
    if fault == "write-fails-on-rank0" and RANK == 0:
        lm.runs.checkpoint.save_file = failing_write
    elif fault == "signal-on-rank1" and RANK == 1:
        step_of = TrainBatches.step

        def step(self: TrainBatches, i: int) -> Any:
            if i == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            return step_of(self, i)

        TrainBatches.step = step
    elif fault == "no-checkpoint-on-rank1" and RANK == 1:
        lm.training.loop.latest_checkpoint = lambda run_dir: None
    elif fault not in ("write-fails-on-rank0", "signal-on-rank1", "no-checkpoint-on-rank1"):
        sys.exit(f"unknown fault {fault!r}")
    code = main(sys.argv[2:])
    done = os.environ.get("LM_TEST_RANK0_DONE")
    if done and RANK == 0:
        with open(done, "a") as fifo:
            fifo.write("done\n")
    elif done:
        with open(done) as fifo:  # waits for rank 0 to open it, then for its line
            fifo.readline()
    sys.exit(code)
