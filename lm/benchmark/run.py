"""The battery run for one scheme through ``lm compare``'s machinery: its runs planned as a
sweep's (``OUT/<benchmark>/seed<N>``), trained by :func:`lm.compare.sweep.train_plan` (one at a
time or ``--jobs``; finished runs reused, an interrupted one resumed) and measured by
:func:`lm.compare.measure.measure_run` (kept with each run, so a rerun reads it back).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm.benchmark import battery as batteries
from lm.benchmark.battery import SEEDS, Benchmark, builtin_of
from lm.benchmark.card import MARK, make_card, markdown, read_references
from lm.benchmark.page import MARK as PAGE_MARK
from lm.benchmark.page import card_html
from lm.compare.measure import Evaluation, Measure, measure_run, report_prompt
from lm.compare.sweep import auto_jobs_of, train_plan
from lm.config.errors import ConfigError, LMError
from lm.config.load import load_config
from lm.config.sections import Config
from lm.data.sources import print_to_stderr
from lm.runs.directory import check_out_dir
from lm.runtime.device import resolve_device

RESERVED = {
    "model.position": "give the scheme with --position",
    "train.seed": "the battery's seeds are fixed",
}
"""Keys ``--set`` may not give: the bench's own."""


@dataclass(frozen=True)
class Planned:
    benchmark: Benchmark
    seed: int
    run_dir: Path
    keys: list[str]
    config: Config


@dataclass(frozen=True)
class BenchRun:
    """One run's scores (by score id, ``benchmark: score``) and, for the length curve, its loss
    at each length (``"2x"``: loss; None past a learned table)."""

    benchmark: str
    seed: int
    run_dir: Path
    scores: dict[str, float | None]
    curve: dict[str, float | None] | None = None


def scheme_name(spec: str) -> str:
    """A builtin's name, or an outside scheme's class: the default folder's name."""
    return spec.rpartition(":")[2] if ":" in spec else spec


def default_out(spec: str, battery: str, overrides: list[str]) -> Path:
    """``runs/bench/NAME``: a builtin's name (p-rope's with its settings) or the class's."""
    suffix = "-quick" if battery == "quick" else ""
    return Path("runs/bench") / f"{builtin_of(spec, overrides) or scheme_name(spec)}{suffix}"


def plan(
    spec: str,
    overrides: list[str],
    battery: str,
    out: Path,
    benchmarks: tuple[Benchmark, ...] | None = None,
) -> list[Planned]:
    """Every run of the battery, its config built and checked before anything trains: a bad
    ``spec`` is said once, a bad ``--set`` with the benchmark it fails in."""
    benchmarks = benchmarks or batteries.benchmarks(battery)
    for key in overrides:
        name = key.partition("=")[0].strip()
        if name in RESERVED:
            raise ConfigError(f"--set {name}: lm bench sets it ({RESERVED[name]})")
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("--position: give a builtin scheme's name or path/to/file.py:Class")
    first = benchmarks[0]
    load_config(first.path(), [*first.settings(battery), f"model.position={spec}"], "--position")
    planned = []
    for benchmark in benchmarks:
        for seed in SEEDS[battery]:
            keys = [*benchmark.settings(battery), f"model.position={spec}", *overrides]
            keys.append(f"train.seed={seed}")
            try:
                config = load_config(benchmark.path(), keys)
            except ConfigError as e:
                raise ConfigError(f"{benchmark.name} ({benchmark.config}): {e}") from None
            run_dir = out / folder(benchmark) / f"seed{seed}"
            planned.append(Planned(benchmark, seed, run_dir, keys, config))
    return planned


def folder(benchmark: Benchmark) -> str:
    return benchmark.name.replace(" ", "-")


def check_writable(out: Path) -> None:
    """``--out`` made now, so that a folder that cannot be written fails before any training."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".lm-bench-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise LMError(f"--out {out}: cannot be written ({e.strerror})") from None


def run_battery(
    planned: list[Planned],
    battery: str,
    jobs: int | str = 1,
    log: Callable[[str], None] = print_to_stderr,
    quiet: bool = False,
) -> list[BenchRun]:
    """Train (or reuse, or resume) every planned run, then measure each, a line per run."""
    device = resolve_device(planned[0].config.train.device, "train.device")
    if jobs == "auto":  # decided on the length curve, the battery's costliest shape
        curve = [p.config for p in planned if p.benchmark == planned[0].benchmark]
        jobs = auto_jobs_of(curve, device, log)
    entries = [(p.run_dir, p.keys) for p in planned]
    paths = [p.benchmark.path() for p in planned]
    configs = [p.config for p in planned]
    train_plan(entries, configs, paths, jobs, configs[0], device, quiet, log)
    return [measure(p, battery, str(device), log) for p in planned]


def measure(p: Planned, battery: str, device: str, log: Callable[[str], None]) -> BenchRun:
    """One run's scores, measured as lm compare's report measures it (or read back)."""
    b = p.benchmark
    batches = b.quick_batches if battery == "quick" else None
    prompt = report_prompt(Evaluation(), p.config.data)
    setting = Measure(prompt, 1, batches, list(b.lengths) or None, None, device)
    result, _ = measure_run(p.run_dir, setting)
    scores = {s.id(b): s.of(result.extrapolation, result.accuracy) for s in b.scores}
    curve = None
    if b.lengths:
        curve = {r["requested"]: r["loss"] for r in result.extrapolation}
    said = ", ".join(f"{s.name} {s.text(scores[s.id(b)])}" for s in b.scores)
    log(f"bench: {b.name}, seed {p.seed}: {said} ({p.run_dir})")
    return BenchRun(b.name, p.seed, p.run_dir, scores, curve)


def stat(values: list[float | None]) -> dict[str, Any]:
    """Per-seed values, their mean and standard deviation (the sample's; None with one seed);
    mean and std None when a seed has no value."""
    known = [v for v in values if v is not None]
    mean = statistics.fmean(known) if known and len(known) == len(values) else None
    std = statistics.stdev(known) if mean is not None and len(known) > 1 else None
    return {"values": values, "mean": mean, "std": std}


def summary(runs: list[BenchRun]) -> dict[str, Any]:
    """Each score's and each curve length's :func:`stat` over the seeds: what a card and a
    reference are made of."""
    scores: dict[str, list[float | None]] = {}
    curve: dict[str, list[float | None]] = {}
    for run in sorted(runs, key=lambda r: r.seed):
        for key, value in run.scores.items():
            scores.setdefault(key, []).append(value)
        for length, loss in (run.curve or {}).items():
            curve.setdefault(length, []).append(loss)
    return {
        "scores": {k: stat(v) for k, v in scores.items()},
        "curve": {k: stat(v) for k, v in curve.items()},
    }


CARD = ("card.json", "card.md", "card.html")


def _refuse_others(out: Path) -> None:
    """A card file in ``out`` that lm bench did not write is never replaced: refused before
    anything trains."""
    marks = {"card.json": b'"generator": "lm bench"', "card.md": MARK.encode()}
    for name in CARD:
        path = out / name
        if not path.exists():
            continue
        try:
            with path.open("rb") as f:
                ours = marks.get(name, PAGE_MARK.encode()) in f.read(1024)
        except OSError:
            ours = False
        if not ours:
            raise LMError(
                f"--out {out}: {name} there is not a card lm bench wrote; lm bench replaces only "
                "its own: choose another --out"
            )


def bench(
    position: str,
    overrides: list[str] | None = None,
    quick: bool = False,
    out: str | Path | None = None,
    jobs: int | str = 1,
    quiet: bool = False,
    benchmarks: tuple[Benchmark, ...] | None = None,
) -> tuple[dict[str, Any], str]:
    """``lm bench``: the battery for the scheme ``position`` (a builtin's name or an outside
    scheme's spec) with ``overrides`` on every benchmark, then its card written into ``out``
    (default ``runs/bench/<name>``, ``-quick`` for the quick battery). Returns card.json's
    content and card.md's text. ``benchmarks``: a part of the battery (the tests')."""
    log = (lambda line: None) if quiet else print_to_stderr
    battery = "quick" if quick else "full"
    overrides = list(overrides or [])
    out = check_out_dir(out if out is not None else default_out(position, battery, overrides))
    planned = plan(position, overrides, battery, out, benchmarks)
    _refuse_others(out)
    check_writable(out)
    runs = run_battery(planned, battery, jobs, log, quiet)
    card = make_card(position, battery, overrides, summary(runs), read_references())
    text = markdown(card)
    try:
        (out / "card.json").write_text(json.dumps(card, indent=1) + "\n", encoding="utf-8")
        (out / "card.md").write_text(f"{MARK}\n{text}", encoding="utf-8")
        (out / "card.html").write_text(card_html(card), encoding="utf-8")
    except OSError as e:
        raise LMError(f"--out {out}: cannot be written ({e.strerror})") from None
    log(f"bench: wrote {out / 'card.md'}, card.json and card.html")
    return card, text
