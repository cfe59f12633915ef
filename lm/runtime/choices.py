"""Timings that depend on the machine, measured where they run, and kept.

``lm compare --jobs auto`` decides from a training step of the sweep's shape timed on every core
and on one thread (:mod:`lm.compare.auto_jobs`). A machine times each shape once: the timings
are kept in ``choices.json`` under ``$LM_CACHE`` (else ``$XDG_CACHE_HOME/lm``, else
``~/.cache/lm``), keyed by what decides them: the CPU's model name, torch's version, the cores
and the shape. ``lm choices`` prints the file and what it holds; ``lm choices --clear`` empties
it. A damaged or foreign file, or entry, counts as absent (one check, :func:`_valid`, for every
reader); a file that cannot be written leaves the timings used but not kept, and the sweep says
so. ``LM_TUNE=off`` turns measuring off (the test suite does, so that ``--jobs auto`` is one
job there).

A timing taken while other work kept the CPUs busy times that work as much as the step, and a
kept one would outlive it. So each is watched (Linux's ``/proc/stat``: the CPU time every CPU
spent busy, less this process's and its children's), and one during which other work took more
than the CPUs it left free is used but not kept: the number of jobs changes how fast a sweep
trains, never its numbers. Where ``/proc/stat`` cannot be read (not Linux) nothing is watched.
It imports no torch but for the cache key.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm.config.errors import LMError

FILE = "choices.json"

KIND = "compare.probe"
TIMED = ("every", "one")
"""The one kind of entry lm keeps, and its timings: a step on every core, and on one thread."""

BUSY_SLACK = 0.25
"""CPUs' worth of other work a kept measurement may have run beside, beyond the CPUs it left
free: a quiet machine's own housekeeping stays well under it, a second program does not."""


def cache_dir() -> Path:
    """lm's cache folder (measured timings, tokenized data): ``$LM_CACHE``, else
    ``$XDG_CACHE_HOME/lm`` (an absolute path, as the XDG spec asks; a relative one is ignored),
    else ``~/.cache/lm``."""
    if folder := os.environ.get("LM_CACHE"):
        return Path(folder).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path("~/.cache").expanduser()
    return base / "lm"


def cache_file() -> Path:
    """Where measured timings are kept: ``choices.json`` in :func:`cache_dir`."""
    return cache_dir() / FILE


def not_measuring() -> str:
    """Why nothing may be measured in this process (``LM_TUNE=off``, or 0, no, false), or ''."""
    value = os.environ.get("LM_TUNE", "").strip()
    return f"LM_TUNE={value}" if value.lower() in ("off", "0", "no", "false") else ""


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


def key(context: dict[str, Any]) -> str:
    """The cache key of a timing: lm's kind, this machine's CPU and torch, and ``context`` (the
    cores and the shape), as one sorted JSON text."""
    import torch

    entry = {"kind": KIND, "cpu": cpu_name(), "torch": torch.__version__, **context}
    return json.dumps(entry, sort_keys=True, default=str)


def _valid(key: str, entry: Any) -> bool:
    """Whether a kept entry is one this module wrote: its key a JSON object of lm's kind, its
    timings the two lm takes, each a finite number of milliseconds above 0, its date a text."""
    try:
        what = json.loads(key)
    except (ValueError, RecursionError):
        return False
    if not isinstance(what, dict) or what.get("kind") != KIND or not isinstance(entry, dict):
        return False
    ms = entry.get("ms_per_step")
    if not isinstance(ms, dict) or set(ms) != set(TIMED):
        return False
    if not all(type(v) in (int, float) and math.isfinite(v) and v > 0 for v in ms.values()):
        return False
    return isinstance(entry.get("measured"), str)


def load() -> tuple[dict[str, dict[str, Any]], str]:
    """Every kept timing by its key, and what was ignored ('' where nothing was): a file that
    cannot be read or is not JSON counts as empty, an entry this module did not write (a
    damaged or foreign one) is skipped; either is replaced at the next measurement."""
    path = cache_file()
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, ""
    except IsADirectoryError:
        return {}, f"{path} is a folder, not a file"
    except OSError as e:
        return {}, f"{path} cannot be read ({e.strerror or e})"
    except (ValueError, UnicodeDecodeError):
        return {}, f"{path} is not JSON"
    except RecursionError:  # json's parser recurses once per bracket
        return {}, f"{path} is not JSON lm can read (nested too deep)"
    if not isinstance(entries, dict):
        return {}, f"{path} is not a JSON object"
    kept = {k: v for k, v in entries.items() if _valid(k, v)}
    skipped = len(entries) - len(kept)
    return kept, f"{skipped} entr{'y' if skipped == 1 else 'ies'} not of lm's" if skipped else ""


def read() -> dict[str, dict[str, Any]]:
    """Every kept timing by its key (:func:`load`, less what it ignored)."""
    return load()[0]


def _write(entries: dict[str, dict[str, Any]]) -> str:
    """Replace the file whole (a crash mid-write leaves the old one); '' where it was written,
    else why not: a cache that cannot be written costs the next sweep a measurement, and the
    caller says that it was not kept."""
    path = cache_file()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return f"{path} could not be written ({e.strerror or e})"
    return ""


def clear() -> int:
    """Forget every kept timing; returns how many there were. A cache that cannot be removed
    (a folder in its place, under a file, read-only) is an LMError naming it."""
    path = cache_file()
    count = len(read())
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "a folder, not a file lm wrote; left as it is")
        path.unlink(missing_ok=True)
    except OSError as e:
        raise LMError(f"lm choices --clear: cannot remove {path} ({e.strerror or e})") from None
    return count


@dataclass(frozen=True)
class Timing:
    """Milliseconds per step by name, ``measured`` now or ``cached`` from an earlier
    measurement, and why a measurement was not kept ('' where it was, or was read back)."""

    ms: dict[str, float]
    how: str
    not_kept: str = ""


def timing(
    context: dict[str, Any], measure: Callable[[], dict[str, float]], cpus_used: int
) -> Timing:
    """The kept timing for ``context`` on this machine, else ``measure()`` (milliseconds by
    name), kept unless other work beyond the ``cpus_used`` it leaves free ran beside it or the
    file cannot be written."""
    k = key(context)
    if (kept := read().get(k)) is not None:
        return Timing(dict(kept["ms_per_step"]), "cached")
    watch = OtherWork()
    ms = measure()
    if busy := watch.disturbed(cpus_used):
        return Timing(ms, "measured", busy)
    entries = read()
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    entries[k] = {"ms_per_step": ms, "measured": now}
    return Timing(ms, "measured", _write(entries))


SHOWN = ("d_model", "n_layer", "context_length")
"""The model's keys every row of ``lm choices`` names; others where the rows differ in them."""


def rows(entries: dict[str, dict[str, Any]]) -> list[str]:
    """``lm choices``' rows, one per kept timing: each step's milliseconds, the date, and the
    shape: the model's size, the batch and cores, and every other setting in which two rows
    differ (the position scheme, the window ...), so that no two rows read alike."""
    flat = [_flat(json.loads(k)) for k in entries]
    names = {name for f in flat for name in f} - {"kind", "cpu", "torch"}
    names -= {f"model.{k}" for k in SHOWN}
    differ = sorted(n for n in names if len({f.get(n) for f in flat}) > 1)
    out = []
    for f, kept in zip(flat, entries.values(), strict=True):
        ms = kept["ms_per_step"]
        shape = [f"{k}={f.get('model.' + k)}" for k in SHOWN]
        shape[2] = shape[2].replace("context_length", "context")
        usual = [k for k in ("micro_batch", "width", "cores") if k in f and k not in differ]
        shape += [f"{k}={f[k]}" for k in usual]
        shape += [f"{k.removeprefix('model.')}={f.get(k)}" for k in differ]
        out.append(
            f"a step on every core {ms['every']:g} ms, on one thread {ms['one']:g} ms "
            f"(measured {kept['measured']}) for {' '.join(shape)} on {f['cpu']}, "
            f"torch {f['torch']}"
        )
    return out


def _flat(what: dict[str, Any]) -> dict[str, str]:
    """A key's settings by dotted name (``model.position``), each as text (JSON's but for a
    string)."""
    out = {}
    for k, v in what.items():
        for name, value in v.items() if isinstance(v, dict) else [("", v)]:
            text = value if isinstance(value, str) else json.dumps(value)
            out[f"{k}.{name}" if name else k] = text
    return out


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
    """The CPU seconds of this process and of the children it has waited for."""
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

    def said(self) -> str:
        """What else the machine ran while this watched, as a record's row says it: ``alone``
        (at most ``BUSY_SLACK`` CPUs of other work on average) or ``beside other work``."""
        seen = self.cpus()
        if seen is None:
            return "not watched (no /proc/stat)"
        others, cpus = seen
        where = "alone" if others <= BUSY_SLACK else "beside other work"
        return f"{where} (other work {others:.2f} of {cpus} CPUs)"

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
