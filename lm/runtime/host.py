"""The host a job runs on: freed memory kept for reuse, resident memory as the metrics log it,
and stop signals (Ctrl-C, SIGTERM) turned into a checkpoint at the end of the step."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from typing import Any


def retain_freed_host_memory() -> bool:
    """Keep freed CPU memory in the process for the next step instead of returning it to the OS.

    glibc's malloc hands big freed blocks back to the kernel (unmapping them, or trimming the heap),
    so each step's activations come back as fresh pages the kernel must fault in and zero
    (``python scripts/bench.py --malloc-default`` times a step with glibc's own settings
    against these). A step then reuses the memory the previous one freed; the peak is
    unchanged. Returns whether the C library took the settings (glibc does; others have no
    ``mallopt``).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    # Blocks up to 1 GiB come from the heap (bigger ones are mapped), and the heap is never
    # trimmed: any finite trim threshold still returns GPT-2 small's logits to the kernel.
    mapped = mallopt(m_mmap_threshold, 1 << 30)
    return bool(mapped) and bool(mallopt(m_trim_threshold, -1))  # -1: never trim


def resident_mb() -> float | None:
    """This process's resident memory in MiB (Linux), logged so that growth shows."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


class StopSignals:
    """SIGINT/SIGTERM ask the loop to save a checkpoint and stop; the loop looks at the next
    step that logs, evaluates or saves (looking costs every process a wait on the others)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
