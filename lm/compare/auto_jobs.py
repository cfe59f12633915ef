"""``lm compare --jobs auto``: whether runs side by side pay on this machine, measured.

Two one-thread runs at once beat one run on two threads where one run leaves cores idle (a
small model), and lose where one run already fills them (memory bandwidth, a wide model). And
each job is a process of its own, which pays its start (imports, its first step) where one run
at a time trains in lm compare's own process; a short sweep, or one whose last runs are fewer
than the cores, can lose by that alone. So ``auto`` times the sweep's own training step (its
optimizer's included) both ways, on this machine: one process on every core, and one process
per core at once, each on one thread, all of them timing the same stretch of time (a process
still starting while another times would let it time the machine to itself, and overstate the
gain), and how long those processes took to start; its rows as wide as the sweep's batches (a
padded task's are far shorter than the context). From these it predicts the whole sweep's
training both ways (:func:`predict`: its runs, their steps, the rounds, the last runs) and
takes one job per core where that comes at most ``GAIN`` of one at a time, else one job. The
measurement is kept by :mod:`lm.runtime.choices` (by CPU, torch, cores, the model's shape and
the optimizer), so a machine measures each shape once and each sweep decides from it.

A measurement costs seconds of its own, which a short sweep never wins back. So where nothing
is kept, one training step is timed first (after a warm-up: :func:`_probe`), and the sweep's
time one at a time predicted from it; the measurement goes ahead only where its own cost
(:func:`measuring_cost`) is at most ``MEASURE_SHARE`` of that, else the sweep runs one at a time
unmeasured and says so. Side by side is taken only where it saves at least ``1 - GAIN`` of the
time one at a time, which ``MEASURE_SHARE`` does not exceed: a measurement that leads to side by
side has paid for itself, so the sweep is then not slower than one at a time as predicted; one
that leads to one at a time costs at most ``MEASURE_SHARE`` of it, once per shape. On GPUs
``auto`` is one job per device, unmeasured; with ``LM_TUNE=off`` (the test suite) it is one
job.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
import time
from collections.abc import Callable
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

MEASURE_SHARE = 0.1
"""A sweep with nothing kept measures only where the measurement's cost is at most this share
of its time one at a time; at most ``1 - GAIN``, what side by side must save to be taken."""

START_GUESS_S = 3.0
"""A job's start (a process importing torch and building its model) as guessed before any is
timed: part of the measurement's cost, whose side-by-side half starts one process per core."""

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
) -> tuple[int, choices.Choice]:
    """How many of ``runs`` runs of ``config``'s shape (``steps`` each; default the config's)
    to train at once, and how that was decided. ``width``: the positions of a training step's
    rows (default the context; a padded run's batches are as wide as their longest row)."""
    if device.type == "cuda":
        n = max(1, torch.cuda.device_count())
        return n, choices.Choice(str(n), "fallback", why="one job per GPU")
    if cores < 2:
        return 1, choices.Choice("1", "fallback", why="one thread to divide")
    if runs < 2:
        return 1, choices.Choice("1", "fallback", why="one run to train")
    if off := choices.not_measuring():
        return 1, choices.Choice("1", "fallback", why=off)
    m, t = config.model, config.train
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
    if choices.cached("compare.jobs", context, candidates) is None:
        step = _probe(m, t, batch, cores)
        pays, alone, cost = worth_measuring(step, cores, runs, steps or t.max_steps)
        if not pays:
            why = (
                f"{runs} runs of {steps or t.max_steps} steps: about {alone:.0f} s one at a "
                f"time (a step {1000 * step:.0f} ms), too short to pay for measuring side by "
                f"side (about {cost:.0f} s): one at a time, unmeasured"
            )
            return 1, choices.Choice("1", "fallback", why=why)
    measured = choices.choose(
        "compare.jobs", context, candidates, lambda ms: _prefer(ms, cores), measure=_measure,
        cpus_used=cores,
    )  # fmt: skip
    alone, together = predict(measured.ms_per_step, cores, runs, steps or t.max_steps)
    value = str(cores) if together <= GAIN * alone else "1"
    why = (
        f"{runs} runs of {steps or t.max_steps} steps: about {together:.0f} s {cores} at a time, "
        f"{alone:.0f} s one at a time"
    )
    return int(value), dataclasses.replace(measured, value=value, why=why)


def measuring_cost(step_s: float, cores: int) -> float:
    """Seconds a measurement takes for a step of ``step_s`` on every core: one run's warm-up
    and window (:func:`_steps`), then the pool's start, a one-thread warm-up step (about
    ``cores`` times slower) and its window."""
    one = step_s + max(WINDOW_S, MIN_STEPS * step_s)
    lot = cores * step_s
    return one + START_GUESS_S + lot + max(WINDOW_S, MIN_STEPS * lot)


def worth_measuring(step_s: float, cores: int, runs: int, steps: int) -> tuple[bool, float, float]:
    """Whether a sweep of ``runs`` runs of ``steps`` steps, a step ``step_s`` on every core,
    pays for measuring side by side: the measurement's cost at most ``MEASURE_SHARE`` of its
    time one at a time. Also those two times, in seconds."""
    alone, cost = runs * steps * step_s, measuring_cost(step_s, cores)
    return cost <= MEASURE_SHARE * alone, alone, cost


def predict(ms: dict[str, float], cores: int, runs: int, steps: int) -> tuple[float, float]:
    """Seconds to train ``runs`` runs of ``steps`` steps one at a time on every core, and
    ``cores`` at a time, from the measured milliseconds (``1``: a step of one run on every
    core; ``cores``: a step of all the one-thread runs at once; ``start``: a job's start, its
    process, imports and first step, which a run in lm compare's own process does not pay).
    The last runs of a sweep, fewer than the cores, take the cores the others leave
    (:func:`lm.compare.jobs.job_threads`): counted here at one run on every core's rate, so the
    guess errs towards one at a time; a last run alone trains in lm compare's process and pays
    no start."""
    one, lot, start = ms["1"] / 1000, ms[str(cores)] / 1000, ms.get("start", 0.0) / 1000
    rounds, rest = divmod(runs, cores)
    together = rounds * (steps * cores * lot + start)
    if rest:
        together += steps * rest * one + (start if rest > 1 else 0.0)
    return runs * steps * one, together


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


def _probe(model: ModelConfig, train: TrainConfig, batch: tuple[int, int], cores: int) -> float:
    """The seconds of one training step of this shape on every core, after a warm-up step:
    what decides whether the sweep pays for a measurement at all."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(cores)
        step = training_step(model, batch[0], train, width=batch[1])
        step()
        start = time.perf_counter()
        step()
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(before)


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
