"""``train.dtype: auto`` on a CPU, decided by timing the run's own training step in each dtype.

bf16 autocast is faster than fp32 on some CPUs at some shapes and slower on others: on an AMD
EPYC without AMX, PyTorch's fused attention runs its bf16 backward several times slower than
its fp32 one, which the faster bf16 matmuls repay only from width 256; on an Intel Xeon with AMX
the matmuls gain far more. So ``auto`` times a forward and backward pass of the run's model, at
its micro-batch and context, in fp32 and in bf16, and keeps bf16 only where it is clearly faster
(``BF16_MARGIN``): the cheaper numbers must pay for the coarser ones. The answer is kept by
:mod:`lm.runtime.choices`, so a machine measures each shape once.

Not measured, the table of :func:`lm.runtime.device.resolve_dtype` decides instead: on a GPU
(bf16 where supported: the rule every GPU recipe uses), with several processes (each would time
the others' load, and they must agree), on a CPU without bf16 instructions (emulated bf16 is
never faster), and with ``LM_TUNE=off``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F

from lm.config.sections import Config, ModelConfig
from lm.model.transformer import TransformerLM
from lm.runtime import choices
from lm.runtime.device import autocast_context, cpu_bf16_kind, resolve_dtype

BF16_MARGIN = 0.95
"""bf16 is kept where its step takes at most this fraction of fp32's."""

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


RECORDED = {"float32": "fp32", "bfloat16": "bf16"}
"""run.json's names of the dtypes ``auto`` may choose on a CPU."""


def training_dtype(
    config: Config, device: torch.device, processes: int, resumed: str | None = None
) -> tuple[torch.dtype, choices.Choice | None]:
    """The autocast dtype of a run, and how ``auto`` chose it (None: the config named one).
    ``resumed``: the dtype run.json says the run trained with, which a resume keeps, so that
    it continues as it began whatever the cache says now."""
    name = config.train.dtype
    if name != "auto":
        return resolve_dtype(name, device, config.model), None
    if device.type == "cpu" and resumed in RECORDED:
        value = RECORDED[resumed]
        return DTYPES[value], choices.Choice(value, "resumed", why="the dtype it trained with")
    table = resolve_dtype(name, device, config.model)
    fallback = "bf16" if table == torch.bfloat16 else "fp32"
    why = _not_measured(device, processes)
    if why:
        if device.type != "cpu":
            return table, None  # the GPU's rule: there is nothing of this machine's to record
        return table, choices.Choice(fallback, "fallback", why=why)
    choice = choices.choose("train.dtype", _context(config, processes), _steps(config), _prefer)
    return DTYPES[choice.value], choice


def _not_measured(device: torch.device, processes: int) -> str:
    """Why ``auto`` is not measured here, or '' where it is."""
    if device.type != "cpu":
        return "not a CPU"
    if not choices.tuning_enabled():
        return "LM_TUNE=off"
    if processes > 1:
        return f"{processes} processes (each would time the others' load)"
    if cpu_bf16_kind() == "none":
        return "no bf16 instructions on this CPU: fp32"
    return ""


def _context(config: Config, processes: int) -> dict:
    """What decides the choice besides the machine: the device, the threads, the model's shape
    and kernel, and the micro-batch one step runs."""
    m, t = config.model, config.train
    return {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "micro_batch": t.batch_size // t.accumulation(processes),
        "model": {k: v for k, v in dataclasses.asdict(m).items() if not k.startswith("_")},
    }


def _steps(config: Config) -> dict:
    """One timed training step per candidate dtype, on a copy of the run's model."""
    step = training_step(config.model, config.train.batch_size // config.train.accumulation(1))
    return {name: choices.timed(lambda d=dtype: step(d)) for name, dtype in DTYPES.items()}


def training_step(model: ModelConfig, micro: int) -> Callable[[torch.dtype], None]:
    """A forward, loss and backward pass of a fresh model of this shape on random tokens, in
    the given autocast dtype: what the measured choices time. The random number generators are
    left as they were: a run's own initialisation and batches do not depend on whether this
    ran."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = TransformerLM(model)
        ids = torch.randint(0, model.vocab_size, (micro, model.context_length + 1))
    inputs, targets = ids[:, :-1], ids[:, 1:]

    def step(dtype: torch.dtype = torch.float32) -> None:
        with autocast_context(torch.device("cpu"), dtype):
            logits = net(inputs)
        F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).backward()
        net.zero_grad(set_to_none=True)

    return step


def _prefer(ms: dict[str, float]) -> str:
    return "bf16" if ms["bf16"] <= BF16_MARGIN * ms["fp32"] else "fp32"
