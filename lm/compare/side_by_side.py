"""``lm compare --jobs auto``: whether runs side by side pay on this machine, measured.

Two one-thread runs at once beat one run on two threads where one run leaves cores idle (a
small model), and lose where one run already fills them (memory bandwidth, a wide model). So
``auto`` times the sweep's own training step (its optimizer's included) both ways, on this
machine: one process on every core, and one process per core at once, each on one thread, all of
them timing the same stretch of time (a process still starting while another times would let
it time the machine to itself, and overstate the gain); it takes one job per core where
their steps together come at most ``GAIN`` of the single run's time per step, else one job.
The answer is kept by :mod:`lm.runtime.choices` (by CPU, torch, cores, the model's shape and the
optimizer), so a machine measures each shape once. On GPUs ``auto`` is one job per device,
unmeasured; with ``LM_TUNE=off`` (the test suite) it is one job.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from collections.abc import Callable
from typing import Any

import torch

from lm.config.sections import Config, ModelConfig, TrainConfig
from lm.runtime import choices
from lm.training.tune import training_step

GAIN = 0.9
"""Side by side is chosen where the jobs' time per step, together, is at most this fraction of
one run's on every core: a smaller gain is within a machine's drift."""

WINDOW_S = 1.5
"""Seconds of steps each measurement times, after one warm-up."""

MIN_STEPS = 3
"""Steps each measurement times at least (a big model's step may take longer than the window)."""

BARRIER_TIMEOUT_S = 300.0
"""How long a process of the pool waits for the others to be ready (a process that died
would otherwise keep the rest waiting for ever)."""


def auto_jobs(config: Config, device: torch.device, cores: int) -> tuple[int, choices.Choice]:
    """How many runs to train at once for ``config``'s shape, and how that was decided."""
    if device.type == "cuda":
        n = max(1, torch.cuda.device_count())
        return n, choices.Choice(str(n), "fallback", why="one job per GPU")
    if cores < 2:
        return 1, choices.Choice("1", "fallback", why="one thread to divide")
    if not choices.tuning_enabled():
        return 1, choices.Choice("1", "fallback", why="LM_TUNE=off")
    m, t = config.model, config.train
    micro = t.batch_size // t.accumulation(1)
    context = {
        "device": "cpu",
        "cores": cores,
        "micro_batch": micro,
        "optimizer": t.optimizer,
        "model": {k: v for k, v in dataclasses.asdict(m).items() if not k.startswith("_")},
    }
    candidates = {
        "1": lambda: _one(m, t, micro, cores),
        str(cores): lambda: _together(m, t, micro, cores),
    }
    choice = choices.choose(
        "compare.jobs", context, candidates, lambda ms: _prefer(ms, cores), measure=_measure
    )
    return int(choice.value), choice


def _prefer(ms: dict[str, float], cores: int) -> str:
    return str(cores) if ms[str(cores)] <= GAIN * ms["1"] else "1"


def _measure(candidates: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Each candidate's milliseconds per step (it times its own warm-up and steps)."""
    return {name: round(1000 * run(), 3) for name, run in candidates.items()}


_START: Any = None
"""In a process of :func:`_together`'s pool: the barrier its runs start timing at."""


def _share(start: Any) -> None:
    global _START
    _START = start


def _steps(model: ModelConfig, train: TrainConfig, micro: int, threads: int) -> float:
    """The seconds a whole training step of this shape takes (forward, backward and the
    sweep's optimizer: ``lm.training.tune.training_step``) on ``threads`` threads: after a
    warm-up, as many steps as fill ``WINDOW_S``. In :func:`_together`'s pool every process
    starts timing at once, so that each times only the stretch when all of them run (a
    process timing while another still starts would time a machine to itself)."""
    torch.set_num_threads(threads)
    step = training_step(model, micro, train)
    step()
    if _START is not None:
        _START.wait()
    count, begin = 0, time.perf_counter()
    while True:
        step()
        count += 1
        elapsed = time.perf_counter() - begin
        if elapsed >= WINDOW_S and count >= MIN_STEPS:
            return elapsed / count


def _one(model: ModelConfig, train: TrainConfig, micro: int, cores: int) -> float:
    """One run on every core: its seconds per step."""
    before = torch.get_num_threads()
    try:
        return _steps(model, train, micro, cores)
    finally:
        torch.set_num_threads(before)


def _together(model: ModelConfig, train: TrainConfig, micro: int, cores: int) -> float:
    """``cores`` one-thread runs at once, each in its own process: the seconds per step of the
    lot (their rates add up)."""
    spawn = multiprocessing.get_context("spawn")
    start = spawn.Barrier(cores, timeout=BARRIER_TIMEOUT_S)
    with spawn.Pool(cores, initializer=_share, initargs=(start,)) as pool:
        # One task a process (chunksize 1): each waits at the barrier for all the others.
        each = pool.starmap(_steps, [(model, train, micro, 1)] * cores, chunksize=1)
    return 1.0 / sum(1.0 / s for s in each)
