"""Choices that depend on the machine, measured where they run, and kept.

Which autocast dtype trains faster on a CPU depends on the CPU (Intel's AMX tiles, AVX-512-BF16
dot products, or neither), on the attention kernel and on the model's shape, and a table of CPU
kinds is wrong on the next CPU. So a choice left to ``auto`` is timed on this machine, once, for
the run's own shape, and the answer is kept in ``choices.json`` under ``$LM_CACHE`` (default
``~/.cache/lm``), keyed by what decides it: the CPU's model name, torch's version, the device and
the shape. Later runs read it: the first pays a few seconds, the rest nothing. ``lm choices``
prints the file and what it holds; ``lm choices --clear`` empties it.

``LM_TUNE=off`` turns measuring off (the test suite does, so that its choices are fixed, and
``lm compare`` for its runs, so that two jobs at once never time each other and every run
trains the same numbers one at a time or side by side): a choice then comes from the fallback
its caller gives, as it would without this module.

This module times what it is given and keeps the answers; what to time (a training step in
each dtype) is the caller's (``lm.training.tune``). It imports no torch.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILE = "choices.json"


def cache_file() -> Path:
    """Where measured choices are kept: ``$LM_CACHE/choices.json`` (default ``~/.cache/lm``)."""
    return Path(os.environ.get("LM_CACHE") or "~/.cache/lm").expanduser() / FILE


def tuning_enabled() -> bool:
    """Whether ``auto`` may measure (``LM_TUNE=off`` says no)."""
    return os.environ.get("LM_TUNE", "").strip().lower() not in ("off", "0", "no", "false")


@contextlib.contextmanager
def fixed() -> Iterator[None]:
    """Measuring off while inside, for this process and those it starts (a sweep's runs)."""
    before = os.environ.get("LM_TUNE")
    os.environ["LM_TUNE"] = "off"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LM_TUNE", None)
        else:
            os.environ["LM_TUNE"] = before


def cpu_name() -> str:
    """The CPU's model name as the kernel reports it (``AMD EPYC 9R14 ...``), else what Python
    knows of the processor."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@dataclass(frozen=True)
class Choice:
    """One choice: the value taken, how (``measured`` now, ``cached`` from an earlier
    measurement, or ``fallback`` when measuring was off or not possible, with ``why``), and
    the milliseconds per step each candidate took where it was measured."""

    value: str
    how: str
    ms_per_step: dict[str, float] = field(default_factory=dict)
    why: str = ""

    def record(self) -> dict[str, Any]:
        """As run.json's ``ran`` keeps it."""
        out: dict[str, Any] = {"value": self.value, "how": self.how}
        if self.ms_per_step:
            out["ms_per_step"] = self.ms_per_step
        if self.how in ("measured", "cached"):
            out["cache"] = str(cache_file())
        if self.why:
            out["why"] = self.why
        return out


def key(kind: str, context: dict[str, Any]) -> str:
    """The cache key of a choice: its kind, this machine's CPU and torch, and ``context`` (the
    device and the shape), as one sorted JSON text."""
    import torch

    entry = {"kind": kind, "cpu": cpu_name(), "torch": torch.__version__, **context}
    return json.dumps(entry, sort_keys=True, default=str)


def read() -> dict[str, dict[str, Any]]:
    """Every kept choice by its key; a file that is not one this module wrote counts as empty
    (it is rewritten at the next measurement)."""
    try:
        entries = json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _write(entries: dict[str, dict[str, Any]]) -> None:
    """Replace the file whole (a crash mid-write leaves the old one), best effort: a cache that
    cannot be written costs the next run a measurement, not its training."""
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def clear() -> int:
    """Forget every kept choice; returns how many there were."""
    count = len(read())
    cache_file().unlink(missing_ok=True)
    return count


def choose(
    kind: str,
    context: dict[str, Any],
    candidates: dict[str, Callable[[], float]],
    prefer: Callable[[dict[str, float]], str],
    measure: Callable[[dict[str, Callable[[], float]]], dict[str, float]] | None = None,
) -> Choice:
    """The kept choice of ``kind`` for ``context`` on this machine, or a new measurement:
    each of ``candidates`` (name -> a function timing one step, in seconds) is timed in turn,
    interleaved (or by ``measure``), and ``prefer`` picks from their milliseconds per step."""
    k = key(kind, context)
    kept = read().get(k)
    if kept and kept.get("value") in candidates:
        return Choice(kept["value"], "cached", dict(kept.get("ms_per_step", {})))
    ms = (measure or interleaved)(candidates)
    value = prefer(ms)
    entries = read()
    entries[k] = {
        "value": value,
        "ms_per_step": ms,
        "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    _write(entries)
    return Choice(value, "measured", ms)


def interleaved(candidates: dict[str, Callable[[], float]], rounds: int = 3) -> dict[str, float]:
    """Median milliseconds per step of each candidate: one warm-up step each, then ``rounds``
    rounds of one step of every candidate in turn, so that a machine slowing down slows them
    all alike. A warm-up step over a second makes it one round (a big model: seconds count)."""
    warm = {name: step() for name, step in candidates.items()}
    if max(warm.values()) > 1.0:
        rounds = 1
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, step in candidates.items():
            times[name].append(step())
    return {name: round(1000 * statistics.median(t), 3) for name, t in times.items()}


def timed(step: Callable[[], object]) -> Callable[[], float]:
    """``step`` as a function returning its wall time in seconds."""

    def run() -> float:
        start = time.perf_counter()
        step()
        return time.perf_counter() - start

    return run
