"""``python tests/slow_launcher.py DELAY ARGS...``: the ``lm`` command (``lm ARGS...``) with a
sleep of DELAY seconds after each file a checkpoint writes, so that a test can kill the process
while a checkpoint is half-written."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import lm.runs.checkpoint
from lm.cli import main


def slowed(write: Callable[..., Any], delay: float) -> Callable[..., Any]:
    def slow_write(*args: Any, **kwargs: Any) -> Any:
        result = write(*args, **kwargs)
        time.sleep(delay)
        return result

    return slow_write


if __name__ == "__main__":
    delay = float(sys.argv[1])
    # The weights file and the optimizer file of a checkpoint, before its state.json.
    lm.runs.checkpoint.save_model = slowed(lm.runs.checkpoint.save_model, delay)
    lm.runs.checkpoint.save_file = slowed(lm.runs.checkpoint.save_file, delay)
    sys.exit(main(sys.argv[2:]))
