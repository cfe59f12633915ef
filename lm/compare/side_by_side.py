"""``lm compare --jobs auto``: whether runs side by side pay on this machine, measured.

Two one-thread runs at once beat one run on two threads where one run leaves cores idle (a
small model), and lose where one run already fills them (memory bandwidth, a wide model). So
``auto`` times the sweep's own training step both ways, on this machine: one process on every
core, and one process per core at once, each on one thread; it takes one job per core where
their steps together come at most ``GAIN`` of the single run's time per step, else one job. The
answer is kept by :mod:`lm.runtime.choices` (by CPU, torch, cores and the model's shape), so a
machine measures each shape once. On GPUs ``auto`` is one job per device, unmeasured; with
``LM_TUNE=off`` (the test suite) it is one job.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
from collections.abc import Callable

import torch

from lm.config.sections import Config, ModelConfig
from lm.runtime import choices
from lm.training.tune import training_step

GAIN = 0.9
"""Side by side is chosen where the jobs' time per step, together, is at most this fraction of
one run's on every core: a smaller gain is within a machine's drift."""

STEPS = 4
"""Timed steps per measurement, after one warm-up."""


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
        "model": {k: v for k, v in dataclasses.asdict(m).items() if not k.startswith("_")},
    }
    candidates = {
        "1": lambda: _one(m, micro, cores),
        str(cores): lambda: _together(m, micro, cores),
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


def _steps(model_config: ModelConfig, micro: int, threads: int) -> float:
    """The median seconds of a training step (``lm.training.tune.training_step``) on
    ``threads`` threads, after a warm-up."""
    torch.set_num_threads(threads)
    step = choices.timed(training_step(model_config, micro))
    return statistics.median([step() for _ in range(STEPS + 1)][1:])


def _one(model_config: ModelConfig, micro: int, cores: int) -> float:
    """One run on every core: its seconds per step."""
    before = torch.get_num_threads()
    try:
        return _steps(model_config, micro, cores)
    finally:
        torch.set_num_threads(before)


def _together(model_config: ModelConfig, micro: int, cores: int) -> float:
    """``cores`` one-thread runs at once, each in its own process: the seconds per step of the
    lot (one step of all of them takes the slowest's time; their rate adds up)."""
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(cores) as pool:
        each = pool.starmap(_steps, [(model_config, micro, 1)] * cores)
    return 1.0 / sum(1.0 / s for s in each)
