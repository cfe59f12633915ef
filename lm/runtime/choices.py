"""Choices that depend on the machine, measured where they run, and kept.

Which autocast dtype trains faster on a CPU depends on the CPU (Intel's AMX tiles, AVX-512-BF16
dot products, or neither), on the attention kernel and on the model's shape, and a table of CPU
kinds is wrong on the next CPU. So a choice left to ``auto`` is timed on this machine, once, for
the run's own shape, and the answer is kept in ``choices.json`` under ``$LM_CACHE`` (else
``$XDG_CACHE_HOME/lm``, else ``~/.cache/lm``), keyed by what decides it: the CPU's model name,
torch's version, the device and the shape. Later runs read it: the first pays a few seconds,
the rest nothing. ``lm choices`` prints the file and what it holds; ``lm choices --clear``
empties it. A damaged or foreign file, or entry, counts as absent; a file that cannot be
written leaves the measurement used but not kept, and the run's record says so.

``LM_TUNE=off`` turns measuring off (the test suite does, so that its choices are fixed), and
so does ``lm compare`` for its runs (:func:`fixed`), so that two jobs at once never time each
other and every run trains the same numbers one at a time or side by side: a choice then comes
from the fallback its caller gives, as it would without this module, and says which of the two
kept it from measuring.

A measurement taken while other work kept the CPUs busy times that work as much as the
candidates, and a cached answer would outlive it. So each measurement is watched (Linux's
``/proc/stat``: the CPU time every CPU spent busy, less this process's and its children's); one
during which other work took more than the CPUs it left free is not kept, and the next run
measures again. A run's dtype and kernel change its numbers, so there it gives way to the
portable default (fp32, sdpa): one command trains one result however busy the machine; the
jobs of ``--jobs auto`` change only how fast a sweep trains, so there it is used. Where
``/proc/stat`` cannot be read (not Linux) nothing is watched.

An entry counts only if it is one lm writes, checked once (:func:`_valid`) for every reader:
a kind lm keeps, one of its values, every candidate's timing in milliseconds above 0.

This module times what it is given and keeps the answers; what to time (a training step in
each dtype) is the caller's (``lm.training.tune``). It imports no torch.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm.config.errors import LMError

FILE = "choices.json"

BUSY_SLACK = 0.25
"""CPUs' worth of other work a kept measurement may have run beside, beyond the CPUs it left
free: a quiet machine's own housekeeping stays well under it, a second program does not."""


def cache_dir() -> Path:
    """lm's cache folder (measured choices, tokenized data): ``$LM_CACHE``, else
    ``$XDG_CACHE_HOME/lm`` (an absolute path, as the XDG spec asks; a relative one is ignored),
    else ``~/.cache/lm``."""
    if folder := os.environ.get("LM_CACHE"):
        return Path(folder).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path("~/.cache").expanduser()
    return base / "lm"


def cache_file() -> Path:
    """Where measured choices are kept: ``choices.json`` in :func:`cache_dir`."""
    return cache_dir() / FILE


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


TIMED = {"train.dtype": ("fp32", "bf16"), "model.kernel": ("sdpa", "math")}
"""The settings ``auto`` times for a run (``lm.training.tune``), each with its candidates."""


def _expected(what: dict[str, Any]) -> tuple[set[str], set[str]] | None:
    """The values an entry of this key's kind may take and the timings it names, or None for
    a kind lm does not keep: a run's settings (one, or the dtype and the kernel together, whose
    candidates are pairs such as ``bf16 math``), ``--jobs auto``'s probe (a step on every core
    and on one thread) and its measurement (one job or one per core, and a job's start)."""
    kind = what.get("kind")
    if kind == "compare.probe":
        return {"probe"}, {"every", "one"}
    if kind == "compare.jobs":
        cores = what.get("cores")
        if not (type(cores) is int and cores >= 2):
            return None
        return {"1", str(cores)}, {"1", str(cores), "start"}
    if kind not in ("train.dtype", "model.kernel", "train.dtype+model.kernel"):
        return None
    pairs = itertools.product(*(TIMED[setting] for setting in kind.split("+")))
    names = {" ".join(pair) for pair in pairs}
    return names, names


def _valid(key: str, entry: Any) -> bool:
    """Whether a kept entry is one this module wrote, so that every reader (``auto``,
    ``--jobs auto``, ``lm choices``) sees the same entries: its key a JSON object of a kind lm
    keeps, its value one that kind may take, its timings every candidate's and nothing else,
    each a finite number of milliseconds above 0, its date a text."""
    try:
        what = json.loads(key)
    except (ValueError, RecursionError):
        return False
    expected = _expected(what) if isinstance(what, dict) else None
    if expected is None or not isinstance(entry, dict):
        return False
    values, timed = expected
    ms = entry.get("ms_per_step")
    value = entry.get("value")
    if not isinstance(value, str) or value not in values or not isinstance(ms, dict):
        return False
    if set(ms) != timed:
        return False
    if not all(type(v) in (int, float) and math.isfinite(v) and v > 0 for v in ms.values()):
        return False
    return isinstance(entry.get("measured"), str)


def load() -> tuple[dict[str, dict[str, Any]], str]:
    """Every kept choice by its key, and what was ignored ('' where nothing was): a file that
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
    """Every kept choice by its key (:func:`load`, less what it ignored)."""
    return load()[0]


def _write(entries: dict[str, dict[str, Any]]) -> str:
    """Replace the file whole (a crash mid-write leaves the old one); '' where it was written,
    else why not: a cache that cannot be written costs the next run a measurement, not its
    training, and the caller says that it was not kept."""
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
    """Forget every kept choice; returns how many there were. A cache that cannot be removed
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


def cached(kind: str, context: dict[str, Any], candidates: Any) -> Choice | None:
    """The kept choice of ``kind`` for ``context`` (one of ``candidates``), or None: what
    :func:`choose` reads before it measures."""
    kept = read().get(key(kind, context))
    if kept and kept["value"] in candidates:
        return Choice(kept["value"], "cached", dict(kept.get("ms_per_step", {})))
    return None


def choose(
    kind: str,
    context: dict[str, Any],
    candidates: dict[str, Callable[[], float]],
    prefer: Callable[[dict[str, float]], str],
    measure: Callable[[dict[str, Callable[[], float]]], dict[str, float]] | None = None,
    cpus_used: int | None = None,
    default: str | None = None,
) -> Choice:
    """The kept choice of ``kind`` for ``context`` on this machine, or a new measurement:
    each of ``candidates`` (name -> a function timing one step, in seconds) is timed in turn,
    interleaved (or by ``measure``), and ``prefer`` picks from their milliseconds per step.
    ``cpus_used``: the CPUs the measurement keeps busy (default: all), so that other work on
    the rest does not count against it; a measurement beside more, or one the cache cannot
    hold (its file cannot be written), is used but not kept, and says why; a measurement
    beside more that would change what a run computes gives way to ``default`` (named where
    it would: its timings are the other work's as much as the candidates', and two runs of one
    command would choose apart), with its timings and why."""
    k = key(kind, context)
    if (earlier := cached(kind, context, candidates)) is not None:
        return earlier
    watch = OtherWork()
    ms = (measure or interleaved)(candidates)
    value = prefer(ms)
    if busy := watch.disturbed(cpus_used):
        if default is not None:
            why = f"the default: measured beside other work, which decides nothing ({busy})"
            return Choice(default, "fallback", ms, why=why, not_kept=busy)
        return Choice(value, "measured", ms, not_kept=busy)
    entries = read()
    entries[k] = {
        "value": value,
        "ms_per_step": ms,
        "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return Choice(value, "measured", ms, not_kept=_write(entries))


SHOWN = ("d_model", "n_layer", "context_length")
"""The model's keys every row of ``lm choices`` names; others where the rows differ in them."""


def rows(entries: dict[str, dict[str, Any]]) -> list[str]:
    """``lm choices``' rows, one per kept choice: the kind, the value, each candidate's
    timing, the date, and the shape: the model's size, the batch and threads, and every other
    setting in which two rows differ (the position scheme, the window ...), so that no two
    rows read alike."""
    whats = [json.loads(k) for k in entries]
    flat = [_flat(w) for w in whats]
    fixed = {"kind", "cpu", "torch", *(f"model.{k}" for k in SHOWN)}
    differ: dict[str, list[str]] = {}  # by kind: the settings in which its rows differ
    for kind in {w["kind"] for w in whats}:
        same = [f for f in flat if f["kind"] == kind]
        names = {name for f in same for name in f} - fixed
        differ[kind] = sorted(n for n in names if len({f.get(n) for f in same}) > 1)
    out = []
    for what, f, kept in zip(whats, flat, entries.values(), strict=True):
        timings = ", ".join(f"{k} {v:g} ms" for k, v in kept.get("ms_per_step", {}).items())
        # --jobs auto decides each sweep from the timings, its runs and steps, not one value.
        jobs = what["kind"] in ("compare.jobs", "compare.probe")
        value = "each sweep from" if jobs else kept["value"]
        shape = [f"{k}={f.get('model.' + k)}" for k in SHOWN]
        shape[2] = shape[2].replace("context_length", "context")
        usual = ("micro_batch", "width", "cores") if "cores" in f else ("micro_batch", "threads")
        shape += [f"{k}={f[k]}" for k in usual if k in f and k not in differ[what["kind"]]]
        shape += [f"{k.removeprefix('model.')}={f.get(k)}" for k in differ[what["kind"]]]
        out.append(
            f"{what['kind']}: {value} ({timings}; measured {kept.get('measured')}) for "
            f"{' '.join(shape)} on {what.get('cpu')}, torch {what.get('torch')}"
        )
    return out


def _flat(what: dict[str, Any]) -> dict[str, str]:
    """A key's settings by dotted name (``model.position``), each as JSON text."""
    out = {}
    for k, v in what.items():
        if isinstance(v, dict):
            out.update({f"{k}.{k2}": _text(v2) for k2, v2 in v.items()})
        else:
            out[k] = _text(v)
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


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
