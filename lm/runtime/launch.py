"""What ``torchrun`` tells a process before any collective: its rank, and whether it has joined
the others. No torch here, so that the command line says ``--help``, ``--version`` and its
one-line errors without loading it."""

from __future__ import annotations

import os

from lm.config.errors import SharedError

_joined = False  # whether this process has joined torchrun's process group


def launched_rank() -> int | None:
    """This process's rank when ``torchrun`` started several (before they join, too); None for
    a process alone."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return int(os.environ.get("RANK", "0"))


def mark_joined() -> None:
    """This process has joined the others (``lm.runtime.distributed.init_world``)."""
    global _joined
    _joined = True


def every_rank_meets(error: BaseException) -> bool:
    """Whether every process of the job meets ``error`` alike, so that rank 0 alone says it: a
    :class:`SharedError`, or any error before the processes joined (each read the same command
    line, config and files). After that, an error of one process is said by that process."""
    return isinstance(error, SharedError) or not _joined
