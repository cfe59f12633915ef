"""``lm compare --jobs auto``: whether runs side by side pay on this machine, measured.

Two one-thread runs at once beat one run on two threads where one run leaves cores idle (a
small model), and lose where one run already fills them (memory bandwidth, a wide model). And
each job is a process of its own, which pays its start (imports, its first step) where one run
at a time trains in lm compare's own process. So ``auto`` times the sweep's own training step
(its optimizer's, clipping's and skip test's included), on this machine, in this process: a step
on every core, and a step on one thread. Runs of a sweep differ (CoPE's step costs three of
RoPE's), so each other model of the sweep is timed on one thread too, where that costs at most
``WEIGH_SHARE`` of the sweep: what orders the runs (the longest first, so that no long run is
left alone at the end) and weighs them in the prediction. From these :func:`predict` plays the
whole sweep both ways: one at a time on every core, and side by side in one-thread jobs that
start once and, when no run waits, share the cores the finished ones gave back
(:mod:`lm.compare.jobs`), the last run alone in lm compare's process. ``auto`` takes one job
per core where that comes at most ``GAIN`` of one at a time, else one job.

What this process cannot see is how much jobs side by side slow each other (memory bandwidth):
there it assumes none. A sweep long enough to pay for it measures that too, where nothing is
kept (one process per core at once, each on one thread, all of them timing the same stretch of
time, their rows as wide as the sweep's batches), and keeps it by :mod:`lm.runtime.choices` (by
CPU, torch, cores, the model's shape and the optimizer), so a machine measures each shape once
and each sweep decides from it: the measurement goes ahead only where its own cost
(:func:`measuring_cost`) is at most ``MEASURE_SHARE`` of the sweep one at a time. A model that
one run already spreads over every core shows no gain in this process, so the assumption errs
only for small models, where jobs side by side share little; and the prediction leaves out
building and evaluating each run, which side by side divides between the cores too. On GPUs
``auto`` is one job per device, unmeasured; with ``LM_TUNE=off`` (the test suite) it is one
job.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lm.config.sections import Config, ModelConfig, TrainConfig
from lm.runtime import choices
from lm.training.tune import training_step

GAIN = 0.9
"""Side by side is chosen where the sweep's predicted time is at most this fraction of one run
at a time on every core: a smaller gain is within a machine's drift."""

WINDOW_S = 1.5
"""Seconds of steps each measurement times, after one warm-up."""

MIN_STEPS = 3
"""Steps each measurement times at least (a big model's step may take longer than the window)."""

WEIGH_SHARE = 0.02
"""The share of a sweep's time one at a time that timing its other models may take."""

MEASURE_SHARE = 0.1
"""A sweep with nothing kept measures only where the measurement's cost is at most this share
of its time one at a time; at most ``1 - GAIN``, what side by side must save to be taken."""

START_GUESS_S = 2.5
"""A job's start (a process importing torch and building its model) as guessed before any is
timed: part of the measurement's cost, whose side-by-side half starts one process per core, and
of side by side where it is not measured and this machine has kept no other shape's."""

BARRIER_TIMEOUT_S = 300.0
"""How long a process of the pool waits for the others to be ready (a process that died
would otherwise keep the rest waiting for ever)."""


def auto_jobs(
    config: Config,
    device: torch.device,
    cores: int,
    runs: int = 2,
    steps: int | None = None,
    width: int | None = None,
    weigh: Callable[[float, float, bool], Sequence[float]] | None = None,
) -> tuple[int, choices.Choice]:
    """How many of ``runs`` runs of ``config``'s shape (``steps`` each; default the config's)
    to train at once, and how that was decided. ``width``: the positions of a training step's
    rows (default the context; a padded run's batches are as wide as their longest row).
    ``weigh(seconds, step, alone)``: each run's cost against one run of ``config`` (its steps
    and its model's step), timing the sweep's other models in at most ``seconds`` (``step``:
    the config's own step on one thread; ``alone``: whether it was timed alone in this
    process, as the others will be. A step timed beside other jobs is slower and would weigh
    the others too light, so then the config's model is timed again with them)."""
    if device.type == "cuda":
        n = max(1, torch.cuda.device_count())
        return n, choices.Choice(str(n), "fallback", why="one job per GPU")
    why = "one thread to divide" if cores < 2 else "one run to train" if runs < 2 else ""
    if why := why or choices.not_measuring():
        return 1, choices.Choice("1", "fallback", why=why)
    m, t = config.model, config.train
    steps = steps or t.max_steps
    weigh = weigh or (lambda seconds, step, alone: [1.0] * runs)  # all alike
    micro = t.batch_size // t.accumulation(1)
    batch = (micro, m.context_length if width is None else width)
    context = {
        "device": "cpu",
        "cores": cores,
        "micro_batch": micro,
        "width": batch[1],
        "optimizer": t.optimizer,
        "model": {k: v for k, v in dataclasses.asdict(m).items() if not k.startswith("_")},
        "measures": "steps and start",  # entries kept before a job's start was timed: anew
    }
    candidates = {
        "1": lambda: _one(m, t, batch, cores),
        str(cores): lambda: _together(m, t, batch, cores),
    }
    weights = None
    if choices.cached("compare.jobs", context, candidates) is None:
        weights, decided = _probe_and_weigh(config, batch, context, cores, runs, steps, weigh)
        if decided:  # measuring side by side would not pay: decided from this process alone
            return decided
    chosen = choices.choose(
        "compare.jobs", context, candidates, lambda ms: _prefer(ms, cores), measure=_measure,
        cpus_used=cores,
    )  # fmt: skip
    if weights is None:  # kept: weighed against the pool's step, timed beside the other jobs
        ms = chosen.ms_per_step
        one = ms[str(cores)] * cores / 1000
        weights = list(weigh(WEIGH_SHARE * (runs * steps * ms["1"] / 1000), one, False))
    return _decide(chosen, cores, steps, weights)


def _probe_and_weigh(
    config: Config,
    batch: tuple[int, int],
    context: dict[str, Any],
    cores: int,
    runs: int,
    steps: int,
    weigh: Callable[[float, float, bool], Sequence[float]],
) -> tuple[list[float], tuple[int, choices.Choice] | None]:
    """With no measurement of side by side kept: the runs' weights from a step timed in this
    process on every core and on one thread (kept too: a machine times each shape's step once),
    and the decision from these steps alone where measuring side by side would not pay."""

    def measure(_: object) -> dict[str, float]:  # in milliseconds, as the cache keeps them
        every, one = _probe(config.model, config.train, batch, cores)
        return {"every": round(1000 * every, 3), "one": round(1000 * one, 3)}

    timed = choices.choose(
        "compare.probe", context, {"probe": _probe}, lambda ms: "probe", measure=measure,
        cpus_used=cores,
    )  # fmt: skip
    every, one = timed.ms_per_step["every"] / 1000, timed.ms_per_step["one"] / 1000
    # Unmeasured, jobs side by side are taken to run at one thread's speed alone.
    probed = {"1": 1000 * every, str(cores): 1000 * one / cores, "start": 1000 * _start()}
    weights = list(weigh(WEIGH_SHARE * (runs * steps * every), one, True))
    pays, cost = measuring_pays(every, cores, steps, weights)
    if pays:
        return weights, None
    when = "now" if timed.how == "measured" else "earlier"
    note = (
        f"; side by side timed in this process only ({when}): measuring it in {cores} "
        f"processes (about {cost:.0f} s) would not pay"
    )
    probe = choices.Choice("1", "probed", probed, not_kept=timed.not_kept)
    return weights, _decide(probe, cores, steps, weights, note)


def _decide(
    chosen: choices.Choice, cores: int, steps: int, weights: list[float], note: str = ""
) -> tuple[int, choices.Choice]:
    """Side by side or one at a time, from ``chosen``'s milliseconds and the runs' weights;
    ``note`` ends the reason given."""
    alone, together = predict(chosen.ms_per_step, cores, len(weights), steps, weights)
    value = str(cores) if together <= GAIN * alone else "1"
    unequal = " of unequal cost" if len(set(weights)) > 1 else ""
    why = (
        f"{len(weights)} runs{unequal} of {steps} steps: about {together:.0f} s {cores} at a "
        f"time, {alone:.0f} s one at a time{note}"
    )
    return int(value), dataclasses.replace(chosen, value=value, why=why)


def _start() -> float:
    """A job's start in seconds, as this machine's kept measurements of other shapes found it
    (their median: importing and a first step vary little with the model), else guessed."""
    mine = {"kind": "compare.jobs", "cpu": choices.cpu_name()}
    starts = [
        entry["ms_per_step"]["start"] / 1000
        for k, entry in choices.read().items()
        if mine.items() <= json.loads(k).items() and "start" in entry.get("ms_per_step", {})
    ]
    return statistics.median(starts) if starts else START_GUESS_S


def measuring_cost(step_s: float, cores: int) -> float:
    """Seconds a measurement takes for a step of ``step_s`` on every core: one run's warm-up
    and window (:func:`_steps`), then the pool's start, a one-thread warm-up step (about
    ``cores`` times slower) and its window."""
    one = step_s + max(WINDOW_S, MIN_STEPS * step_s)
    lot = cores * step_s
    return one + START_GUESS_S + lot + max(WINDOW_S, MIN_STEPS * lot)


def measuring_pays(
    step_s: float, cores: int, steps: int, weights: Sequence[float]
) -> tuple[bool, float]:
    """Whether a sweep of runs of ``steps`` steps, each weighed by ``weights``, a step ``step_s``
    on every core, pays for measuring side by side: the measurement's cost at most
    ``MEASURE_SHARE`` of its time one at a time. Also that cost, in seconds."""
    cost = measuring_cost(step_s, cores)
    return cost <= MEASURE_SHARE * sum(weights) * steps * step_s, cost


def predict(
    ms: dict[str, float],
    cores: int,
    runs: int,
    steps: int,
    weights: Sequence[float] | None = None,
) -> tuple[float, float]:
    """Seconds to train ``runs`` runs of ``steps`` steps one at a time on every core, and in
    ``cores`` one-thread jobs, from the milliseconds (``1``: a step of one run on every core;
    ``cores``: a step of all the one-thread runs at once, per run; ``start``: a job's start, its
    process, imports and first step, which a run in lm compare's own process does not pay).
    ``weights``: each run's cost against such a run (default all 1). Side by side is played as
    :func:`lm.compare.jobs.run_jobs` trains: the costliest runs first, a job's start once, and
    once no run waits, the runs left share every core (a run's speed on ``k`` threads taken
    between one thread's and every core's, in proportion); a last run with none beside it
    trains in lm compare's process, on every core, with no start."""
    every, lot, start = ms["1"] / 1000, ms[str(cores)] / 1000, ms.get("start", 0.0) / 1000
    weights = sorted(weights if weights is not None else [1.0] * runs, reverse=True)
    alone = steps * every * sum(weights)
    one = lot * cores  # a one-thread run's step beside the others
    full = max(1.0, one / every)  # a run's speed on every core, against one thread

    def speed(threads: int) -> float:
        return 1.0 + (full - 1.0) * (threads - 1) / max(1, cores - 1)

    left = [steps * one * w for w in weights]  # seconds each run needs on one thread
    waiting, running, clock, started = list(range(len(left))), [], 0.0, False
    while waiting or running:
        while waiting and len(running) < cores:
            if not running and len(waiting) == 1:
                clock += steps * every * weights[waiting.pop()]  # alone, in lm compare's process
                break
            if not started:
                clock, started = clock + start, True
            running.append(waiting.pop(0))
        if not running:
            continue
        if waiting:
            speeds = [1.0] * len(running)
        else:
            share, extra = divmod(cores, len(running))
            speeds = [speed(share + (i < extra)) for i in range(len(running))]
        dt = min(left[r] / v for r, v in zip(running, speeds, strict=True))
        clock += dt
        for r, v in zip(running, speeds, strict=True):
            left[r] -= dt * v
        running = [r for r in running if left[r] > 1e-9]
    return alone, clock


def _prefer(ms: dict[str, float], cores: int) -> str:
    """Whether side by side pays per step (what the cache keeps; a sweep decides by
    :func:`predict`)."""
    return str(cores) if ms[str(cores)] <= GAIN * ms["1"] else "1"


def _measure(candidates: dict[str, Callable[[], Any]]) -> dict[str, float]:
    """Each candidate's milliseconds per step (it times its own warm-up and steps), and a job's
    start (``start``: :func:`_together`'s; one run in this process has none)."""
    ms = {}
    for name, run in candidates.items():
        seconds, start = run()
        ms[name] = round(1000 * seconds, 3)
        if start is not None:
            ms["start"] = round(1000 * start, 3)
    return ms


_START: Any = None
"""In a process of :func:`_together`'s pool: the barrier its runs start timing at."""


def _share(start: Any) -> None:
    global _START
    _START = start


def _steps(
    model: ModelConfig, train: TrainConfig, batch: tuple[int, int], threads: int
) -> tuple[float, float]:
    """The seconds a whole training step of this shape takes (forward, backward and the
    sweep's optimizer: ``lm.training.tune.training_step``; ``batch``: its rows and their
    width) on ``threads`` threads: after a warm-up, as many steps as fill ``WINDOW_S``. In
    :func:`_together`'s pool every process starts timing at once, so that each times only the
    stretch when all of them run (a process timing while another still starts would time a
    machine to itself). Also when the process was ready: its imports, the model and the
    warm-up step done."""
    torch.set_num_threads(threads)
    step = training_step(model, batch[0], train, width=batch[1])
    step()
    ready = time.time()  # the wall clock, which every process of the pool shares
    if _START is not None:
        _START.wait()
    count, begin = 0, time.perf_counter()
    while True:
        step()
        count += 1
        elapsed = time.perf_counter() - begin
        if elapsed >= WINDOW_S and count >= MIN_STEPS:
            return elapsed / count, ready


def _probe(
    model: ModelConfig, train: TrainConfig, batch: tuple[int, int], cores: int
) -> tuple[float, float]:
    """The seconds of one training step of this shape on every core, after a warm-up step, and
    of one on one thread: what this process can tell of side by side without a pool."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(cores)
        step = training_step(model, batch[0], train, width=batch[1])
        step()
        every = _timed(step)
        torch.set_num_threads(1)
        return every, _timed(step)
    finally:
        torch.set_num_threads(before)


def step_weights(
    models: Sequence[ModelConfig],
    train: TrainConfig,
    batch: tuple[int, int],
    first: float | None = None,
) -> list[float]:
    """Each model's training step on one thread against the first's (each distinct model timed
    once, after a warm-up step; ``first``: the first's seconds where already known): the cost
    of a sweep's runs against one another."""
    before = torch.get_num_threads()
    seconds: dict[str, float] = {} if first is None else {repr(models[0]): first}
    try:
        torch.set_num_threads(1)
        for model in models:
            shape = repr(model)
            if shape not in seconds:
                step = training_step(model, batch[0], train, width=batch[1])
                step()
                seconds[shape] = _timed(step)
    finally:
        torch.set_num_threads(before)
    return [seconds[repr(model)] / seconds[repr(models[0])] for model in models]


def _timed(step: Callable[[], object], times: int = 2) -> float:
    """The fastest of ``times`` steps, in seconds (one step alone varies by a tenth)."""
    best = float("inf")
    for _ in range(times):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best


def _one(
    model: ModelConfig, train: TrainConfig, batch: tuple[int, int], cores: int
) -> tuple[float, None]:
    """One run on every core: its seconds per step (and no process's start)."""
    before = torch.get_num_threads()
    try:
        return _steps(model, train, batch, cores)[0], None
    finally:
        torch.set_num_threads(before)


def _together(
    model: ModelConfig, train: TrainConfig, batch: tuple[int, int], cores: int
) -> tuple[float, float]:
    """``cores`` one-thread runs at once, each in its own process: the seconds per step of the
    lot (their rates add up), and the seconds a process took to be ready, started with the
    others (the median): what a sweep's job pays before it trains, as it starts beside the
    others."""
    spawn = multiprocessing.get_context("spawn")
    start = spawn.Barrier(cores, timeout=BARRIER_TIMEOUT_S)
    launched = time.time()
    with spawn.Pool(cores, initializer=_share, initargs=(start,)) as pool:
        # One task a process (chunksize 1): each waits at the barrier for all the others.
        each = pool.starmap(_steps, [(model, train, batch, 1)] * cores, chunksize=1)
    lot = 1.0 / sum(1.0 / seconds for seconds, _ in each)
    return lot, statistics.median(ready - launched for _, ready in each)
