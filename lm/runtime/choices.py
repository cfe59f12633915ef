"""Choices that depend on the machine, measured where they run, and kept.

Which autocast dtype trains faster on a CPU depends on the CPU (Intel's AMX tiles, AVX-512-BF16
dot products, or neither), on the attention kernel and on the model's shape, and a table of CPU
kinds is wrong on the next CPU. So a choice left to ``auto`` is timed on this machine, once, for
the run's own shape, and the answer is kept in ``choices.json`` under ``$LM_CACHE`` (default
``~/.cache/lm``), keyed by what decides it: the CPU's model name, torch's version, the device and
the shape. Later runs read it: the first pays a few seconds, the rest nothing. ``lm choices``
prints the file and what it holds; ``lm choices --clear`` empties it.

``LM_TUNE=off`` turns measuring off (the test suite does, so that its choices are fixed), and
so does ``lm compare`` for its runs (:func:`fixed`), so that two jobs at once never time each
other and every run trains the same numbers one at a time or side by side: a choice then comes
from the fallback its caller gives, as it would without this module, and says which of the two
kept it from measuring.

A measurement taken while other work kept the CPUs busy times that work as much as the
candidates, and a cached answer would outlive it. So each measurement is watched (Linux's
``/proc/stat``: the CPU time every CPU spent busy, less this process's and its children's); one
during which other work took more than the CPUs it left free is used by the run that made it
but not kept, and the next run measures again. Where ``/proc/stat`` cannot be read (not Linux)
nothing is watched.

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

BUSY_SLACK = 0.25
"""CPUs' worth of other work a kept measurement may have run beside, beyond the CPUs it left
free: a quiet machine's own housekeeping stays well under it, a second program does not."""


def cache_file() -> Path:
    """Where measured choices are kept: ``$LM_CACHE/choices.json`` (default ``~/.cache/lm``)."""
    return Path(os.environ.get("LM_CACHE") or "~/.cache/lm").expanduser() / FILE


SWEEP_RUN = "sweep-run"
"""``LM_TUNE``'s value inside :func:`fixed`: measuring off, for a sweep's runs."""


def not_measuring() -> str:
    """Why ``auto`` may not measure in this process, or '' where it may: ``LM_TUNE=off`` (or
    0, no, false), or a sweep's run."""
    value = os.environ.get("LM_TUNE", "").strip()
    if value == SWEEP_RUN:
        return "a run of lm compare, which trains the same numbers one at a time or side by side"
    return f"LM_TUNE={value}" if value.lower() in ("off", "0", "no", "false") else ""


@contextlib.contextmanager
def fixed() -> Iterator[None]:
    """Measuring off while inside, for this process and those it starts (a sweep's runs)."""
    before = os.environ.get("LM_TUNE")
    os.environ["LM_TUNE"] = SWEEP_RUN
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
    not_kept: str = ""  # a measurement the cache refused: why (other work ran beside it)

    def record(self) -> dict[str, Any]:
        """As run.json's ``ran`` keeps it."""
        out: dict[str, Any] = {"value": self.value, "how": self.how}
        if self.ms_per_step:
            out["ms_per_step"] = self.ms_per_step
        if self.how in ("measured", "cached") and not self.not_kept:
            out["cache"] = str(cache_file())
        if self.not_kept:
            out["not_kept"] = self.not_kept
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
    cpus_used: int | None = None,
) -> Choice:
    """The kept choice of ``kind`` for ``context`` on this machine, or a new measurement:
    each of ``candidates`` (name -> a function timing one step, in seconds) is timed in turn,
    interleaved (or by ``measure``), and ``prefer`` picks from their milliseconds per step.
    ``cpus_used``: the CPUs the measurement keeps busy (default: all), so that other work on
    the rest does not count against it; a measurement beside more is not kept."""
    k = key(kind, context)
    kept = read().get(k)
    if kept and kept.get("value") in candidates:
        return Choice(kept["value"], "cached", dict(kept.get("ms_per_step", {})))
    watch = OtherWork()
    ms = (measure or interleaved)(candidates)
    value = prefer(ms)
    if busy := watch.disturbed(cpus_used):
        return Choice(value, "measured", ms, not_kept=busy)
    entries = read()
    entries[k] = {
        "value": value,
        "ms_per_step": ms,
        "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    _write(entries)
    return Choice(value, "measured", ms)


def cpu_seconds() -> tuple[float, int] | None:
    """The seconds this machine's CPUs have spent busy since it booted, all of them together
    (user, nice, system, interrupts and steal: a virtual machine's CPU lent to another), and
    how many CPUs there are; None where ``/proc/stat`` cannot be read."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        fields = [int(v) for v in lines[0].split()[1:]]
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / ticks, cpus


def own_cpu_seconds() -> float:
    """The CPU seconds of this process and of the children it has waited for (a measurement's
    pool of processes has ended before it is read)."""
    import resource

    me, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


class OtherWork:
    """Watches, from its creation, how much of the machine work other than this process (and
    its children) keeps busy."""

    def __init__(self) -> None:
        self.machine, self.own, self.wall = cpu_seconds(), own_cpu_seconds(), time.perf_counter()

    def cpus(self) -> tuple[float, int] | None:
        """The CPUs' worth other work kept busy on average so far, and the machine's CPUs;
        None where that cannot be read."""
        now = cpu_seconds()
        if now is None or self.machine is None:
            return None
        wall = max(time.perf_counter() - self.wall, 1e-9)
        others = (now[0] - self.machine[0]) - (own_cpu_seconds() - self.own)
        return max(others, 0.0) / wall, now[1]

    def disturbed(self, cpus_used: int | None) -> str:
        """Why a measurement made since the start is not to be kept, or '' where it may be:
        other work took more than the CPUs it left free, plus ``BUSY_SLACK``."""
        seen = self.cpus()
        if seen is None:
            return ""
        others, cpus = seen
        free = max(cpus - (cpus if cpus_used is None else cpus_used), 0)
        if others <= free + BUSY_SLACK:
            return ""
        return f"other work kept {others:.1f} of this machine's {cpus} CPUs busy while it ran"


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
