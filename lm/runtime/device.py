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


# The narrowest model width from which bf16 autocast trains faster than fp32 on a CPU, by its
# bf16 kind and the attention kernel (``flex`` trains with sdpa's kernel on a CPU): measured with
# scripts/dtype_speed.py (docs/performance.md). Without AMX, PyTorch's fused attention runs its
# bf16 backward pass several times slower than its fp32 one, which the faster bf16 matmuls repay
# only from width 256; the notes' explicit attention is all matmuls and pays at every width
# measured. With AMX the figure is an earlier sitting's, with sdpa.
CPU_BF16_MIN_WIDTH = {
    ("avx512_bf16", "sdpa"): 256,
    ("avx512_bf16", "math"): 64,
    ("amx", "sdpa"): 384,
    ("amx", "math"): 384,
}


def resolve_dtype(name: str, device: torch.device, model: ModelConfig) -> torch.dtype:
    """The autocast dtype (float32 = no autocast). ``auto``: on CUDA bf16 where supported, else
    fp16; on a CPU bf16 from the width where it was measured faster (``CPU_BF16_MIN_WIDTH``),
    else fp32; fp32 elsewhere."""
    if name == "fp32":
        return torch.float32
    if name == "bf16":
        return torch.bfloat16
    if name == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        kernel = "math" if model.kernel == "math" else "sdpa"
        min_width = CPU_BF16_MIN_WIDTH.get((cpu_bf16_kind(), kernel))
        if min_width is not None and model.d_model >= min_width:
            return torch.bfloat16
    return torch.float32


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
