"""``train.dtype: auto`` and ``model.kernel: auto`` on a CPU, decided by timing the run's own
training step with each candidate.

bf16 autocast is faster than fp32 on some CPUs at some shapes and slower on others: on an AMD
EPYC without AMX, PyTorch's fused attention runs its bf16 backward several times slower than
its fp32 one, which the faster bf16 matmuls repay only from width 256; on an Intel Xeon with AMX
the matmuls gain far more. Which attention kernel is faster changes with the machine as well:
for the Shakespeare recipe in fp32, the notes' explicit attention (``math``) beat PyTorch's
fused one (``sdpa``) on an AVX-512 EPYC and lost to it on an AVX2 one (docs/performance.md).
So ``auto`` times a forward and backward pass of the run's model, at its micro-batch and
its batches' width (the context; a padded run's rows, often shorter), for every pair of the
settings left to it (fp32 and bf16; sdpa and math), and keeps:

- the explicit kernel only where its step takes at most ``KERNEL_MARGIN`` of SDPA's (the
  default, unless clearly beaten);
- bf16 only where its best step takes at most ``BF16_MARGIN`` of fp32's best: the cheaper
  numbers must pay for the coarser ones.

The answer is kept by :mod:`lm.runtime.choices`, so a machine measures each shape once. The
kernel chosen is written into the run's config.yaml, so evaluation, sampling and a resume run
the kernel it trained with; a resume keeps its dtype too (run.json's).

Not measured, a setting comes from the table instead: the dtype from
:func:`lm.runtime.device.resolve_dtype`, the kernel ``sdpa``. That is so on a GPU (bf16 where
supported, the rule every GPU recipe uses; whether measuring kernels pays there is not known:
no GPU has run this), with several processes (each would time the others' load, and they must
agree), with ``LM_TUNE=off`` (the suite, and a sweep's runs), for the dtype on a CPU without
bf16 instructions (emulated bf16 is never faster), and for the kernel of a model whose training
step runs the explicit formula whatever is asked (stick-breaking; a learned bias on a CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from lm.config.sections import Config, ModelConfig, TrainConfig
from lm.data.batches import TrainBatches
from lm.data.sources import PreparedData
from lm.model.masks import masks, positions
from lm.model.transformer import TransformerLM
from lm.runtime import choices
from lm.runtime.device import autocast_context, cpu_bf16_kind, resolve_dtype
from lm.training.optim import build_optimizer, step_unless_nonfinite

BF16_MARGIN = 0.95
"""bf16 is kept where its step takes at most this fraction of fp32's."""

KERNEL_MARGIN = 0.97
"""The explicit kernel is kept where its step takes at most this fraction of SDPA's."""

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""The dtypes ``auto`` times on a CPU, by the names the cache keeps (``choices.TIMED``)."""

KERNELS = choices.TIMED["model.kernel"]
"""The kernels ``auto`` times on a CPU (FlexAttention has no backward pass there)."""

FALLBACK_KERNEL = "sdpa"
FALLBACK_DTYPE = "fp32"
"""What a measurement disturbed by other work gives way to: the portable default, so that one
command trains one set of numbers whatever else the machine runs."""

RECORDED = {"float32": "fp32", "bfloat16": "bf16"}
"""run.json's names of the dtypes ``auto`` may choose on a CPU."""


@dataclasses.dataclass(frozen=True)
class DtypeAndKernel:
    """What a run trains with, and how ``auto`` chose each (None: the config named it)."""

    dtype: torch.dtype
    kernel: str
    dtype_choice: choices.Choice | None = None
    kernel_choice: choices.Choice | None = None


def training_choices(
    config: Config,
    device: torch.device,
    processes: int,
    resumed_dtype: str | None = None,
    resumed_kernel: str | None = None,
    data: PreparedData | None = None,
) -> DtypeAndKernel:
    """The autocast dtype and attention kernel of a run. ``resumed_dtype``: the dtype run.json
    says the run trained with; ``resumed_kernel``: the kernel of its config.yaml. A resume keeps
    both, so that it continues as it began whatever the cache says now. ``data``: the run's,
    whose batches' width a measurement times (:func:`batch_width`; without it, the context)."""
    settled, dtype_free, kernel_free = _settled(
        config, device, processes, resumed_dtype, resumed_kernel
    )
    if not (dtype_free or kernel_free):
        return settled
    return _measured(config, processes, settled, dtype_free, kernel_free, data)


def _settled(
    config: Config,
    device: torch.device,
    processes: int,
    resumed_dtype: str | None,
    resumed_kernel: str | None,
) -> tuple[DtypeAndKernel, bool, bool]:
    """What is decided without measuring (a setting named, a resume's own, a fallback and why),
    and whether the dtype and the kernel are still free, left to a measurement."""
    dtype_free, kernel_free = config.train.dtype == "auto", config.model.kernel == "auto"
    kernel, kernel_choice = config.model.kernel, None
    if kernel_free and resumed_kernel in KERNELS:
        kernel, kernel_free = resumed_kernel, False
        kernel_choice = choices.Choice(kernel, "resumed", why="the kernel it trained with")
    dtype, dtype_choice = None, None
    if dtype_free and device.type == "cpu" and resumed_dtype in RECORDED:
        value, dtype_free = RECORDED[resumed_dtype], False
        dtype = DTYPES[value]
        dtype_choice = choices.Choice(value, "resumed", why="the dtype it trained with")
    why = _not_measured(device, processes)
    kernel_why = why or (_same_kernel(config.model) if kernel_free else "")
    if kernel_free and kernel_why:
        kernel, kernel_free = FALLBACK_KERNEL, False
        kernel_choice = choices.Choice(kernel, "fallback", why=kernel_why)
    if dtype_free:
        no_bf16 = cpu_bf16_kind() == "none"
        dtype_why = why or ("no bf16 instructions on this CPU: fp32" if no_bf16 else "")
        if dtype_why:
            dtype_free = False
            dtype = resolve_dtype("auto", device, dataclasses.replace(config.model, kernel=kernel))
            if device.type == "cpu":  # a GPU's rule: there is nothing of this machine's to record
                name = "bf16" if dtype == torch.bfloat16 else "fp32"
                dtype_choice = choices.Choice(name, "fallback", why=dtype_why)
    elif dtype is None:
        dtype = resolve_dtype(config.train.dtype, device, config.model)
    # A dtype still free is measured; until then fp32 stands in for it.
    chosen = DtypeAndKernel(dtype or torch.float32, kernel, dtype_choice, kernel_choice)
    return chosen, dtype_free, kernel_free


def _measured(
    config: Config,
    processes: int,
    settled: DtypeAndKernel,
    dtype_free: bool,
    kernel_free: bool,
    data: PreparedData | None,
) -> DtypeAndKernel:
    """The free settings measured (or read from the cache): a training step of each
    candidate pair, the settled setting as it is. The steps' models are built only if the
    cache does not answer."""
    fixed = str(settled.dtype).removeprefix("torch.")  # a dtype not free: as it is
    dtypes = dict(DTYPES) if dtype_free else {fixed: settled.dtype}
    kernels = KERNELS if kernel_free else (settled.kernel,)
    pairs = {
        _name(d, k, dtype_free, kernel_free): (d, k) for d, k in itertools.product(dtypes, kernels)
    }
    kind = "+".join(
        name for name, free in (("train.dtype", dtype_free), ("model.kernel", kernel_free)) if free
    )
    width = batch_width(config, data) if data is not None else config.model.context_length
    context = _context(config, processes)
    if width != config.model.context_length:  # a padded run's; a packed run's key as it was
        context["width"] = width
    if not dtype_free:
        context["dtype"] = fixed
    model, micro = config.model, config.train.batch_size // config.train.accumulation(1)

    @functools.cache  # one model per kernel, the dtype only autocast's; built at its first step
    def net(kernel: str) -> Callable[[torch.dtype], None]:
        return training_step(dataclasses.replace(model, kernel=kernel), micro, width=width)

    steps = {
        name: choices.timed(lambda d=d, k=k: net(k)(dtypes[d])) for name, (d, k) in pairs.items()
    }
    prefer = lambda ms: _prefer_pair(ms, pairs)  # noqa: E731
    default = _name(FALLBACK_DTYPE, FALLBACK_KERNEL, dtype_free, kernel_free)  # the free ones
    threads = torch.get_num_threads()
    choice = choices.choose(kind, context, steps, prefer, cpus_used=threads, default=default)
    d, k = pairs[choice.value]
    chosen = settled
    if dtype_free:
        chosen = dataclasses.replace(
            chosen, dtype=DTYPES[d], dtype_choice=dataclasses.replace(choice, value=d)
        )
    if kernel_free:
        chosen = dataclasses.replace(
            chosen, kernel=k, kernel_choice=dataclasses.replace(choice, value=k)
        )
    return chosen


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


def _name(dtype: str, kernel: str, dtype_free: bool, kernel_free: bool) -> str:
    """A candidate's name in the cache and run.json: its free settings' values (``bf16``,
    ``math``, ``bf16 math``)."""
    return " ".join(v for v, free in ((dtype, dtype_free), (kernel, kernel_free)) if free)


def _not_measured(device: torch.device, processes: int) -> str:
    """Why ``auto`` is not measured here, or '' where it is."""
    if device.type != "cpu":
        return "not a CPU"
    if off := choices.not_measuring():
        return off
    if processes > 1:
        return f"{processes} processes (each would time the others' load)"
    return ""


def _same_kernel(model: ModelConfig) -> str:
    """Why asking for another kernel would not change this model's training step on a CPU, or
    '' where it would: the masks of a training step given sdpa are in another kernel's form."""
    ids = torch.zeros(1, model.context_length, dtype=torch.long)
    with torch.enable_grad():
        where = positions(model, ids, training=True)
        ran = next(iter(masks(model, where, training=True, kernel="sdpa").values())).kernel
    if ran == "sdpa":
        return ""
    return f"its training step runs the explicit formula ({ran}) whatever the kernel"


def _context(config: Config, processes: int) -> dict:
    """What decides the choice besides the machine: the device, the threads, the model's shape
    and settings, and the micro-batch one step runs."""
    m, t = config.model, config.train
    return {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "micro_batch": t.batch_size // t.accumulation(processes),
        "model": {k: v for k, v in dataclasses.asdict(m).items() if not k.startswith("_")},
    }


def training_step(
    model: ModelConfig, micro: int, train: TrainConfig | None = None, width: int | None = None
) -> Callable[[torch.dtype], None]:
    """A forward, loss and backward pass of a fresh model of this shape on random tokens
    (``micro`` rows of ``width`` positions, default the context), in the given autocast dtype:
    what the measured choices time; with ``train``, the rest of the trainer's step too (the
    gradients clipped, the skip test, the optimizer's step: :meth:`Stepper.update`). The random
    number generators are left as they were: a run's own initialisation and batches do not
    depend on whether this ran."""
    width = model.context_length if width is None else width
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = TransformerLM(model)
        ids = torch.randint(0, model.vocab_size, (micro, width + 1))
    inputs, targets = ids[:, :-1], ids[:, 1:]
    optimizer = build_optimizer(net, train, torch.device("cpu")) if train is not None else None

    params = [p for p in net.parameters() if p.requires_grad]
    clip = train.grad_clip if train is not None and train.grad_clip > 0 else float("inf")

    def step(dtype: torch.dtype = torch.float32) -> None:
        with autocast_context(torch.device("cpu"), dtype):
            logits = net(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        if optimizer is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
            step_unless_nonfinite(optimizer, torch.isfinite(norm) & torch.isfinite(loss))
        net.zero_grad(set_to_none=True)

    return step


def _prefer(ms: dict[str, float]) -> str:
    """fp32 or bf16, from their milliseconds per step."""
    return "bf16" if ms["bf16"] <= BF16_MARGIN * ms["fp32"] else "fp32"


def _prefer_kernel(ms: dict[str, float]) -> str:
    """sdpa or math, from their milliseconds per step."""
    return "math" if ms["math"] <= KERNEL_MARGIN * ms["sdpa"] else "sdpa"


def _prefer_pair(ms: dict[str, float], pairs: dict[str, tuple[str, str]]) -> str:
    """The candidate kept: for each dtype its faster kernel (by ``_prefer_kernel``), then the
    dtype whose best is faster (by ``_prefer``)."""
    by_dtype: dict[str, dict[str, str]] = {}
    for name, (d, k) in pairs.items():
        by_dtype.setdefault(d, {})[k] = name
    best = {}
    for d, names in by_dtype.items():
        faster = _prefer_kernel({k: ms[n] for k, n in names.items()}) if len(names) > 1 else None
        best[d] = names[faster] if faster else next(iter(names.values()))
    if len(best) == 1:
        return next(iter(best.values()))
    return best[_prefer({d: ms[n] for d, n in best.items()})]
