"""Where and how a job runs its math: the device, the autocast dtype (``auto`` by the hardware)
and ``torch.compile``. It imports only ``torch`` and the config, so that ``lm sample``, ``lm
eval`` and the scripts pick a device or a dtype without loading the training loop."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Iterator

import torch

from lm.config.errors import ConfigError
from lm.config.sections import ModelConfig


def resolve_device(name: str, key: str = "train.device") -> torch.device:
    """The device ``name`` stands for; ``key`` is what the user wrote it as (a config key or a
    flag such as ``--device``), named in the one-line error when it is no device of this
    machine."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    match = re.fullmatch(r"(cpu|cuda|mps)(?::(\d+))?", name)
    if match is None or (match[2] is not None and match[1] != "cuda"):
        raise ConfigError(f"{key}: {name!r} is not a device; use auto, cpu, cuda, cuda:N or mps")
    if match[1] == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key}: {name} requested but no CUDA device is available")
        if match[2] is not None and int(match[2]) >= torch.cuda.device_count():
            raise ConfigError(
                f"{key}: {name} requested but this machine has {torch.cuda.device_count()} "
                "CUDA device(s)"
            )
    if match[1] == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}: mps requested but MPS is not available")
    return torch.device(name)


def compile_enabled(setting: bool | None, device: torch.device) -> bool:
    """``train.compile``: true, false, or None (left out) for auto, which compiles on CUDA only."""
    return setting if setting is not None else device.type == "cuda"


def compile_model(
    model: torch.nn.Module,
    device: torch.device,
    *,
    fullgraph: bool = False,
    setting: str = "train.compile",
) -> torch.nn.Module:
    """``torch.compile``; on CPU with Inductor's C++ wrapper, which calls the generated kernels
    from C++ instead of one Python line per kernel, an overhead that weighs on small CPU steps
    (``scripts/throughput_vs_nanogpt.py --compile`` times it). Compiling takes seconds
    to a minute and needs a C++ compiler, as any Inductor build on CPU does; so ``train.compile``
    left out (auto) stays eager there. ``fullgraph`` makes a graph break an error; ``setting`` is
    what the error without a compiler names.
    """
    if device.type != "cpu":
        return torch.compile(model, fullgraph=fullgraph)
    compilers = [os.environ.get("CXX") or "g++", "clang++"]
    if not any(shutil.which(c) for c in compilers):
        raise ConfigError(
            f"{setting}: compiling on CPU needs a C++ compiler and none of "
            f"{', '.join(compilers)} is on PATH (set CXX, or turn {setting} off)"
        )
    return torch.compile(model, fullgraph=fullgraph, options={"cpp_wrapper": True})


def cpu_bf16_kind() -> str:
    """How this CPU multiplies bf16: ``amx`` (Intel's matrix tiles, Sapphire Rapids on),
    ``avx512_bf16`` (dot-product instructions without AMX, AMD Zen 4 for one), or ``none``
    (emulated: never faster than fp32)."""
    if getattr(torch.cpu, "_is_amx_tile_supported", bool)():
        return "amx"
    if getattr(torch.cpu, "_is_avx512_bf16_supported", bool)():
        return "avx512_bf16"
    return "none"


BF16_KINDS = ("amx", "avx512_bf16")
BF16_MIN_WIDTH = 128
# train.dtype: auto and model.kernel: auto on a CPU, a rule, not a timing: a busy machine cannot
# change what a command trains. bf16 autocast with the notes' explicit attention (math) where the
# CPU multiplies bf16 in hardware (BF16_KINDS) and the model is at least BF16_MIN_WIDTH wide, else
# fp32 with SDPA: what timing every pair picked at each of the project's shapes on both CPU kinds
# these machines have (docs/performance.md). Milliseconds per training step, fp32 sdpa against
# bf16 math, on an AMD EPYC with avx512_bf16: width 128 80.1 / 47.9 (the main job) and 38.2 /
# 23.5 (the length curve); width 64 (flip-flop) 14.4 / 14.4. On an Intel Xeon with AMX: width 64
# fp32 sdpa fastest (16.0), width 128 bf16 with the formula (29.4-34.0 against 34.8-38.5).
# PyTorch's fused CPU attention runs its bf16 backward slower than its fp32 one (bf16 sdpa 23.4
# at width 64 on the EPYC); the explicit attention is all matmuls.


def auto_rule(
    dtype: str, kernel: str, model: ModelConfig, device: torch.device
) -> tuple[str, str, str]:
    """``train.dtype`` and ``model.kernel`` as a run trains them, and why (one phrase): each as
    the config names it, or left to ``auto``, by the rule: on a CPU the one above (bf16 with
    math as a pair: a config naming fp32 or another kernel keeps fp32 with SDPA for the other);
    on CUDA bf16 where supported, else fp16, with sdpa; elsewhere fp32 with sdpa. A function of
    the device, the CPU's bf16 kind and the config alone."""
    if device.type == "cpu":
        kind = cpu_bf16_kind()
        fast = kind in BF16_KINDS and model.d_model >= BF16_MIN_WIDTH
        pair = fast and dtype in ("auto", "bf16") and kernel in ("auto", "math")
        wide = ">=" if model.d_model >= BF16_MIN_WIDTH else "<"
        why = f"bf16 instructions ({kind}), width {model.d_model} {wide} {BF16_MIN_WIDTH}"
        if kind not in BF16_KINDS:
            why = "no bf16 instructions on this CPU"
        elif fast and not pair:
            named = f"train.dtype {dtype}" if dtype not in ("auto", "bf16") else ""
            why += f", but the config names {named or f'model.kernel {kernel}'}"
        auto = ("bf16", "math") if pair else ("fp32", "sdpa")
    elif device.type == "cuda":
        auto = ("bf16" if torch.cuda.is_bf16_supported() else "fp16", "sdpa")
        why = "a GPU: bf16 where supported, else fp16; sdpa"
    else:
        auto, why = ("fp32", "sdpa"), f"{device.type}: fp32, sdpa"
    return (auto[0] if dtype == "auto" else dtype), (auto[1] if kernel == "auto" else kernel), why


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_dtype(name: str, device: torch.device, model: ModelConfig) -> torch.dtype:
    """The autocast dtype (float32 = no autocast) of ``train.dtype`` ``name``: as named, or
    ``auto`` by :func:`auto_rule` (with the model's kernel)."""
    return DTYPES[auto_rule(name, model.kernel, model, device)[0]]


def autocast_context(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@contextlib.contextmanager
def seeded_draws(device: torch.device, *key: object) -> Iterator[None]:
    """torch's generators, inside, seeded from ``key`` (a run's seed, then what is evaluated:
    split, length, batch...) and restored after: the positions a model draws at evaluation
    (``model.random_positions_eval``) are then a function of the run and the key, and a training
    run's own stream is left where it was."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    devices = [] if device.type == "cpu" else [device]  # the CPU's is always restored
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
        yield
