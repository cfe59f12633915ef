"""``lm compare --jobs auto``: one job, or one per core, for a sweep on a CPU.

One-thread runs side by side (:mod:`lm.compare.jobs`) beat one run on every core where one run
leaves cores idle (a small model), and gain nothing where it already fills them (a wide one).
So ``auto`` times the sweep's own training step (its first run's model, in the dtype and kernel
it trains with, at its micro-batch and its batches' width, with its optimizer, clipping and skip
test) in lm compare's process: on every core, and on one thread. The two timings are kept by
:mod:`lm.runtime.choices`, so a machine times each shape once. One line (:func:`predict`) plays
the sweep both ways from them, and ``auto`` takes one job per core where side by side comes to
at most ``GAIN`` of one at a time, else one job. Measured whole sweeps, and what each part
gains: docs/sweeps.md.

The prediction cannot see how much jobs side by side slow each other (memory bandwidth): it
takes a one-thread step beside the others as fast as alone, and ``GAIN`` leaves that margin. It
takes every run of the sweep to cost what its first does. On GPUs ``auto`` is one job per
device, untimed; with ``LM_TUNE=off`` (the test suite) it is one job.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from lm.config.sections import Config, ModelConfig, TrainConfig
from lm.data.batches import TrainBatches
from lm.data.sources import PreparedData
from lm.model.transformer import TransformerLM
from lm.runtime import choices
from lm.runtime.device import DTYPES, auto_rule, autocast_context
from lm.training.optim import build_optimizer, step_unless_nonfinite

GAIN = 0.9
"""Side by side is taken where the sweep's predicted time is at most this fraction of one run
at a time: the jobs' slowing of each other, which the prediction leaves out, and a machine's
drift fit in the rest."""

START_S = 2.5
"""A job's start (a process importing torch, then building its data and model), paid once by
side by side: the workers train one run after another."""


@dataclass(frozen=True)
class Decision:
    """How many runs to train at once, why, and the step's milliseconds it came from (``every``
    core, ``one`` thread), timed now or read back (``how``), and why they were not kept."""

    jobs: int
    why: str
    ms: dict[str, float] = field(default_factory=dict)
    how: str = ""
    not_kept: str = ""


def auto_jobs(
    config: Config,
    device: torch.device,
    cores: int,
    runs: int,
    steps: int,
    data: PreparedData | None = None,
) -> Decision:
    """How many of ``runs`` runs of ``steps`` steps, each costing a run of ``config`` (its
    vocabulary filled in), to train at once on ``cores`` threads. ``data``: the run's, whose
    batches' width is timed (:func:`batch_width`; without it, the context)."""
    if device.type == "cuda":
        n = max(1, torch.cuda.device_count())
        return Decision(n, "one job per GPU")
    why = "one thread to divide" if cores < 2 else "one run to train" if runs < 2 else ""
    if why := why or choices.not_measuring():
        return Decision(1, why)
    dtype, kernel, _ = auto_rule(config.train.dtype, config.model.kernel, config.model, device)
    model, train = dataclasses.replace(config.model, kernel=kernel), config.train
    micro = train.batch_size // train.accumulation(1)
    width = batch_width(config, data) if data is not None else model.context_length
    context = {
        "device": "cpu",
        "cores": cores,
        "micro_batch": micro,
        "width": width,
        "optimizer": train.optimizer,
        "dtype": dtype,
        "model": {k: v for k, v in dataclasses.asdict(model).items() if not k.startswith("_")},
    }

    def measure() -> dict[str, float]:  # the model is built only where nothing is kept
        return probe(training_step(model, train, micro, width, DTYPES[dtype]), cores)

    timed = choices.timing(context, measure, cpus_used=cores)
    alone, together = predict(timed.ms["every"] / 1000, timed.ms["one"] / 1000, cores, runs, steps)
    n = cores if together <= GAIN * alone else 1
    why = (
        f"{runs} runs of {steps} steps: about {together:.0f} s {cores} at a time, "
        f"{alone:.0f} s one at a time"
    )
    return Decision(n, why, timed.ms, timed.how, timed.not_kept)


def predict(every: float, one: float, cores: int, runs: int, steps: int) -> tuple[float, float]:
    """Seconds to train ``runs`` runs of ``steps`` steps one at a time on every core (``every``
    seconds a step), and side by side in one-thread jobs (``one`` seconds a step): a job's start
    once, then rounds of ``cores`` runs, and the runs left over, fewer than a round, one at a
    time on every core (as the last run trains: in lm compare's process, the cores its own)."""
    rounds, left = divmod(runs, cores)
    return runs * steps * every, START_S + rounds * steps * one + left * steps * every


def probe(step: Callable[[], None], cores: int) -> dict[str, float]:
    """Milliseconds of ``step`` on every core and on one thread, each the faster of two (one
    step varies by a tenth), after a warm-up step; torch's threads given back after."""
    before = torch.get_num_threads()
    ms = {}
    try:
        torch.set_num_threads(cores)
        step()
        for name, threads in (("every", cores), ("one", 1)):
            torch.set_num_threads(threads)
            ms[name] = round(1000 * min(_seconds(step) for _ in range(2)), 3)
    finally:
        torch.set_num_threads(before)
    return ms


def _seconds(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def batch_width(config: Config, data: PreparedData) -> int:
    """The positions of a training step's rows, on average over the run's first epoch: a
    packed run's windows fill the context; a padded batch is as wide as its longest row, and a
    task's rows are often far shorter than the context (the copy task's average 10 of 40)."""
    if config.data.mode != "padded":
        return config.model.context_length
    tc, model = config.train, config.model
    batches = TrainBatches(
        data.train, config.data, model.context_length, tc.batch_size, tc.accumulation(1),
        data.tokenizer.pad_id, tc.seed,
    )  # fmt: skip
    return max(1, round(batches.mean_width))


def training_step(
    model: ModelConfig, train: TrainConfig, rows: int, width: int, dtype: torch.dtype
) -> Callable[[], None]:
    """A training step of a fresh model of this shape on random tokens (``rows`` rows of
    ``width`` positions) in autocast ``dtype``: forward, loss, backward, the gradients clipped,
    the skip test and the optimizer's step (:meth:`lm.training.step.Stepper.update`). The random
    number generators are left as they were: a sweep's runs do not depend on whether this ran."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = TransformerLM(model)
        ids = torch.randint(0, model.vocab_size, (rows, width + 1))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    optimizer = build_optimizer(net, train, torch.device("cpu"))
    params = [p for p in net.parameters() if p.requires_grad]
    clip = train.grad_clip if train.grad_clip > 0 else float("inf")

    def step() -> None:
        with autocast_context(torch.device("cpu"), dtype):
            logits = net(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        step_unless_nonfinite(optimizer, torch.isfinite(norm) & torch.isfinite(loss))
        net.zero_grad(set_to_none=True)

    return step
