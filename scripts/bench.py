"""Training and decoding throughput of `lm`, and MFU against the device's peak.

    python scripts/bench.py                       # every shape, fp32 and bf16
    python scripts/bench.py --shapes nanogpt-cpu --dtypes fp32 --steps 30
    python scripts/bench.py --shapes gpt2-small --dtypes bf16 --compile --batch 16  # on a GPU
    python scripts/bench.py --decode              # KV cache against recomputing, 512 tokens
    python scripts/bench.py --no-train --decode   # decoding alone
    python scripts/bench.py --no-train --decode --compile  # and its one-token step compiled
    python scripts/bench.py --shapes nanogpt-cpu --dtypes fp32 --tokenize  # and BPE tokenizing
    python scripts/bench.py --shapes nanogpt-cpu --dtypes fp32 --malloc-default  # glibc as is
    python scripts/bench.py --shapes main --dtypes fp32 --positions learned,rope --steps 200
    python scripts/bench.py --shapes main --dtypes fp32 --block --steps 200  # Llama's block
    python scripts/bench.py --no-train --decode-kv  # decoding per n_kv_head, and cache bytes
    python scripts/bench.py --shapes flipflop --dtypes fp32,bf16 --compile --steps 100 \
        --positions rope,learned,alibi,cope,fox,none,none+normalize=stick_breaking  # an experiment

``--positions`` replaces each shape's position scheme, one row per scheme; a scheme may carry model
keys joined by ``+`` (``none+normalize=stick_breaking``, ``rope+window=32``,
``rope+normalize=ssmax``, ``rope+rope_p=0.5``). The schemes of a shape train side by side, a step of
each in turn, and each one's tokens/s over the first scheme's is printed as the median of the
step-by-step ratios: a machine whose speed drifts slows them alike. ``--block`` adds, beside each
row, the same shape in the Llama-style block (RMSNorm, SwiGLU, ``n_head / 2`` key/value heads)
with the SwiGLU width that gives it the GPT-2 block's parameter count (:func:`llama_block`), so its
ratio is the new block's tokens/s over GPT-2's at equal size. ``--decode-kv`` times greedy
decoding with the KV cache in the Llama-style block at ``n_kv_head`` = ``n_head``, ``n_head / 2``
and 1, with the bytes of each one's cache for a full context.

For each shape and dtype it times full optimizer steps (the trainer's own data path, forward,
loss, backward, clipping, AdamW) on random tokens after a warm-up, and reports tokens/s and MFU:
model FLOPs per token (6N + 12 L d T, the LM head counted even when tied) times tokens/s, over
the peak of the dtype's matmuls: the datasheet's dense figure for a GPU it knows by name, else
large matmuls measured in the same process, or ``--peak-tflops``; it prints which. It also
reports the page faults a step costs, prints a Markdown table and writes JSON. Run it alone:
on a shared two-core machine any other load stalls steps by far more than 2x.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lm.cli import positive_int
from lm.config.names import POSITIONS
from lm.config.sections import DataConfig, ModelConfig, TrainConfig
from lm.config.values import parse_value
from lm.data.batches import TrainBatches
from lm.data.sources import TokenizedSplit, prepare_data
from lm.model.transformer import TransformerLM
from lm.runtime.device import autocast_context, compile_model, resolve_device
from lm.runtime.distributed import World
from lm.runtime.host import retain_freed_host_memory
from lm.sample import generate
from lm.training.optim import build_optimizer
from lm.training.step import Stepper

# name: (model shape, sequences per step)
SHAPES: dict[str, tuple[dict, int]] = {
    "main": (  # configs/default.yaml, the main job
        dict(n_layer=4, n_head=4, d_model=128, context_length=128, position="rope"),
        16,
    ),
    "nanogpt-cpu": (
        dict(n_layer=4, n_head=4, d_model=128, context_length=64, position="learned"),
        12,
    ),
    "flipflop": (  # configs/flipflop.yaml, the flip-flop experiment's runs (9 characters)
        dict(n_layer=2, n_head=4, d_model=64, context_length=64, position="rope", vocab_size=9),
        32,
    ),
    "length-curve": (  # configs/extrapolation.yaml at batch 16, the every-scheme length curve
        dict(n_layer=4, n_head=4, d_model=128, context_length=64, position="rope", vocab_size=106),
        16,
    ),
    "shakespeare-gpu": (dict(n_layer=6, n_head=6, d_model=384, context_length=256), 16),
    "gpt2-small": (
        dict(n_layer=12, n_head=12, d_model=768, context_length=1024, vocab_size=50304),
        4,
    ),
}
EXPERIMENTS = ("flipflop", "length-curve")
"""Shapes timed only when named: docs/sweeps.md's experiments, not in the default table."""
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# Dense peak TFLOP/s of NVIDIA GPUs, no 2:4 sparsity: (name pattern, label, TFLOP/s per math
# mode). The datasheets print tensor-core figures "with sparsity" (twice the dense rate, marked
# *); those are halved here. "tf32" is what an fp32 matmul runs as on tensor cores once TF32 is
# allowed (as the trainer allows it); bf16 and fp16 are with fp32 accumulation, as autocast
# runs them. Patterns are matched against the upper-cased ``torch.cuda.get_device_name()``,
# first match wins, so a variant precedes its family's plain name.
_SXM_HOPPER = {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0}
_NVL_HOPPER = {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}
_A10 = {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}
GPU_PEAKS: list[tuple[str, str, dict[str, float]]] = [
    # NVIDIA H100 Tensor Core GPU datasheet (SXM, PCIe and NVL columns).
    (
        r"\bH100\b.*\bPCIE\b",
        "H100 PCIe",
        {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0},
    ),
    (r"\bH100\b.*\bNVL\b", "H100 NVL", _NVL_HOPPER),
    (r"\bH100\b", "H100 SXM", _SXM_HOPPER),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM and NVL columns).
    (r"\bH200\b.*\bNVL\b", "H200 NVL", _NVL_HOPPER),
    (r"\bH200\b", "H200 SXM", _SXM_HOPPER),
    # NVIDIA GH200 Grace Hopper Superchip datasheet (its GPU: the H100 SXM rates).
    (r"\bGH200\b", "GH200", _SXM_HOPPER),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe, 40 and 80 GB: the same rates).
    (r"\bA100\b", "A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    # NVIDIA A10 Tensor Core GPU datasheet. The A10G is AWS's version of the same GA102
    # configuration (72 SMs, 288 tensor cores) and has no datasheet of its own.
    (r"\bA10G\b", "A10G", _A10),
    (r"\bA10\b", "A10", _A10),
    # NVIDIA L40S datasheet.
    (r"\bL40S\b", "L40S", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    # NVIDIA L4 Tensor Core GPU datasheet.
    (r"\bL4\b", "L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    # NVIDIA Ada Lovelace GPU architecture whitepaper, GeForce RTX 4090 column (fp32
    # accumulation; GeForce runs it at half the fp16-accumulate rate). Not the 4090 D or laptop.
    (
        r"\bRTX 4090\b(?!.*\b(D|LAPTOP)\b)",
        "RTX 4090",
        {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    ),
    # NVIDIA V100 Tensor Core GPU datasheet (SXM2, PCIe, V100S PCIe): fp16 tensor cores only.
    (r"\bV100S\b", "V100S PCIe", {"fp16": 130.0, "fp32": 16.4}),
    (r"\bV100\b.*\bPCIE\b", "V100 PCIe", {"fp16": 112.0, "fp32": 14.0}),
    (r"\bV100\b", "V100 SXM2", {"fp16": 125.0, "fp32": 15.7}),
    # NVIDIA T4 Tensor Core GPU datasheet (fp16 mixed precision).
    (r"\bT4\b", "T4", {"fp16": 65.0, "fp32": 8.1}),
]


def datasheet_peak(device_name: str, precision: str) -> tuple[str, float] | None:
    """``(label, dense TFLOP/s)`` of a known GPU in ``precision`` (bf16 | fp16 | tf32 | fp32).

    None for an unknown name, a MIG slice (a fraction of the GPU's SMs) or a precision the GPU
    has no rate for (bf16 on a V100). tf32 on a GPU without it is the plain fp32 rate, which is
    what cuBLAS runs there.
    """
    name = device_name.upper()
    if re.search(r"\bMIG\b", name):
        return None
    for pattern, label, peaks in GPU_PEAKS:
        if re.search(pattern, name):
            if precision == "tf32" and "tf32" not in peaks:
                precision = "fp32"
            return (f"{label} {precision}", peaks[precision]) if precision in peaks else None
    return None


def matmul_peak(
    dtype: torch.dtype, device: torch.device, n: int | None = None, window_s: float = 0.1
) -> float:
    """Measured FLOP/s of n x n matmuls in ``dtype``: the machine's ceiling where no datasheet
    names it. Each timing runs enough matmuls back to back to fill ``window_s`` (a GPU's launch
    latency and the host-device syncs then weigh nothing), and the best of five is kept."""
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty_like(a)

    def timed(count: int) -> float:
        _sync(device)
        t = time.perf_counter()
        for _ in range(count):
            torch.matmul(a, b, out=out)
        _sync(device)
        return time.perf_counter() - t

    timed(3)  # kernel choice, clocks up
    count = max(2, min(10_000, math.ceil(window_s / max(timed(1), 1e-9))))
    best = min(timed(count) for _ in range(5))
    return 2 * n**3 * count / best


def matmul_precision(dtype_name: str, device: torch.device) -> str:
    """The math mode a matmul in this training dtype runs in: bf16, or fp32 as TF32 on CUDA
    when it is allowed (main allows it, as the trainer does)."""
    if dtype_name == "fp32" and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return dtype_name


def resolve_peak(
    dtype_name: str, device: torch.device, given_tflops: float | None
) -> tuple[float, str]:
    """The peak FLOP/s that MFU divides by, and where it came from: ``--peak-tflops``, the
    datasheet of a GPU known by name, or else a matmul measured here."""
    if given_tflops is not None:
        return given_tflops * 1e12, f"given (--peak-tflops) {given_tflops:g} TFLOP/s"
    if device.type == "cuda":
        found = datasheet_peak(
            torch.cuda.get_device_name(device), matmul_precision(dtype_name, device)
        )
        if found is not None:
            label, tflops = found
            return tflops * 1e12, f"datasheet {label} {tflops:g} TFLOP/s"
    flops = matmul_peak(DTYPES[dtype_name], device)
    return flops, f"measured {dtype_name} matmul {flops / 1e12:.3f} TFLOP/s"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def random_split(vocab: int, n_tokens: int, seed: int = 0) -> TokenizedSplit:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=n_tokens, dtype=np.int64).astype(np.uint32)
    return TokenizedSplit(tokens=tokens, offsets=np.array([0, n_tokens], dtype=np.int64))


def llama_block(shape: dict, position: str | None = None) -> str:
    """``shape`` (a GPT-2 block) in the Llama-style block as a ``--positions`` variant: RMSNorm,
    SwiGLU, half the key/value heads (all, for an odd ``n_head``), and the SwiGLU width, a
    multiple of 8, whose parameter count is nearest the GPT-2 block's. Per block (no biases)
    GPT-2 has ``4 d^2 + 2 d f`` in attention and MLP, the Llama block ``2 d^2 + 2 d h_kv d_k +
    3 d w``, so ``w = (2 d + 2 f - 2 h_kv d_k) / 3``."""
    cfg = ModelConfig(**{"vocab_size": 65, **shape, **(variant(position) if position else {})})
    d, heads = cfg.d_model, cfg.n_head
    kv = heads // 2 if heads % 2 == 0 else heads
    width = (2 * d + 2 * cfg.ff_dim - 2 * kv * cfg.head_dim) / 3
    width = max(8, 8 * round(width / 8))
    return f"{position or cfg.position_text}+norm=rmsnorm+mlp=swiglu+n_kv_head={kv}+d_ff={width}"


def variant(text: str) -> dict:
    """``rope+window=32`` -> ``{"position": "rope", "window": 32}``: a scheme and model keys."""
    position, *keys = text.split("+")
    return {"position": position, **{k: parse_value(v) for k, v in (x.split("=", 1) for x in keys)}}


class Training:
    """One shape, dtype and position scheme, ready to time full optimizer steps (the trainer's
    own data path, forward, loss, backward, clipping, AdamW) on random tokens."""

    def __init__(
        self,
        shape: str,
        dtype_name: str,
        compiled: bool,
        device: torch.device,
        batch: int | None = None,
        position: str | None = None,
        fused_norm: bool = False,
    ) -> None:
        model_kw, shape_batch = SHAPES[shape]
        self.shape, self.dtype_name, self.compiled, self.device = (
            shape,
            dtype_name,
            compiled,
            device,
        )
        self.batch = batch or shape_batch
        given = variant(position) if position else {}
        self.cfg = ModelConfig(**{"vocab_size": 65, **model_kw, **given})
        torch.manual_seed(0)
        self.model = TransformerLM(self.cfg).to(device)
        self.label = position or self.cfg.position_text
        if fused_norm:  # PyTorch's one-kernel LayerNorm, whose CPU gradient depends on threads
            _use_fused_layer_norm(self.model)
            self.label += " (fused LayerNorm)"
        tc = TrainConfig(batch_size=self.batch, lr=1e-3, grad_clip=1.0)
        optimizer = build_optimizer(self.model, tc, device)
        runner = compile_model(self.model, device) if compiled else self.model
        self.stepper = Stepper(
            runner, self.model, optimizer, torch.amp.GradScaler(device.type, enabled=False),
            autocast_context(device, DTYPES[dtype_name]), World(), device, tc.grad_clip,
        )  # fmt: skip
        split = random_split(self.cfg.vocab_size, 200_000)
        ctx = self.cfg.context_length
        self.batches = TrainBatches(split, DataConfig(), ctx, self.batch, 1, 0, seed=0)
        self.step_times: list[float] = []
        self.data_times: list[float] = []
        self.faults = 0

    def step(self, step: int, timed: bool) -> None:
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        micro, n_targets = self.batches.step(step)
        t1 = time.perf_counter()
        loss = self.stepper.forward_backward(micro, n_targets)
        self.stepper.update(loss)  # (reads nothing back from the device)
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # the step has finished on the device before the clock stops
        t2 = time.perf_counter()
        if timed:
            self.data_times.append(t1 - t0)
            self.step_times.append(t2 - t0)
            self.faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0

    def row(self, peak: tuple[float, str]) -> dict:
        """The timed steps' medians: ``peak`` is (FLOP/s, its source) for MFU."""
        cfg, steps = self.cfg, len(self.step_times)
        step_s = statistics.median(self.step_times)
        tok_s = self.batch * cfg.context_length / step_s
        peak_flops, peak_source = peak
        dims = f"{cfg.n_layer}/{cfg.n_head}/{cfg.d_model}/{cfg.context_length}"
        row = {
            "shape": self.shape,
            "position": self.label,
            "layers/heads/width/ctx": dims,
            "params_M": round(self.model.num_parameters() / 1e6, 2),
            "batch": self.batch,
            "dtype": self.dtype_name,
            "compile": self.compiled,
            "step_ms": round(step_s * 1e3, 2),
            "tokens_per_s": round(tok_s),
            "mfu": tok_s * self.model.flops_per_token(cfg.context_length) / peak_flops,
            "peak_tflops": peak_flops / 1e12,
            "peak_source": peak_source,
            "data_fraction": statistics.median(self.data_times) / step_s,
            "page_faults_per_step": round(self.faults / steps),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        if self.device.type == "cuda":
            row["peak_gpu_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        return row


def _use_fused_layer_norm(model: torch.nn.Module) -> None:
    """Replace lm's LayerNorms (two ops on CPU) by torch.nn.LayerNorm, weights kept."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.LayerNorm):
                fused = torch.nn.LayerNorm(
                    child.normalized_shape, eps=child.eps, bias=child.bias is not None
                ).to(child.weight.device)
                fused.load_state_dict(child.state_dict())
                setattr(module, name, fused)


def bench_side_by_side(runs: list[Training], steps: int, warmup: int) -> None:
    """Time ``runs`` step by step in turn (the order rotated every step), so that a machine
    whose speed drifts slows them alike; each keeps its own step times."""
    if runs and runs[0].device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(runs[0].device)
    for step in range(warmup + steps):
        k = step % len(runs)
        for run in runs[k:] + runs[:k]:
            run.step(step, timed=step >= warmup)


def side_by_side_ratios(runs: list[Training]) -> list[str]:
    """Each run's tokens/s over the first's: the median of the step-by-step ratios (steps taken
    in turn) and their interquartile range."""
    base, lines = runs[0], []
    for run in runs[1:]:
        ratios = sorted(b / r for b, r in zip(base.step_times, run.step_times, strict=True))
        q1, q3 = (ratios[int(f * (len(ratios) - 1))] for f in (0.25, 0.75))
        lines.append(
            f"{run.shape} {run.dtype_name}{' compiled' if run.compiled else ''}: "
            f"{run.label} / {base.label} tokens/s "
            f"{statistics.median(ratios):.3f} (quartiles {q1:.3f}-{q3:.3f}, {len(ratios)} steps "
            "each, in turn)"
        )
    return lines


def profile_steps(run: Training, steps: int, rows: int = 15) -> str:
    """``run``'s next ``steps`` steps under torch.profiler: each op's share of the self time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if run.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for step in range(steps):
            run.step(10**6 + step, timed=False)
    key = "self_cuda_time_total" if run.device.type == "cuda" else "self_cpu_time_total"
    title = f"{run.shape} {run.dtype_name} {run.label}: {steps} steps profiled"
    table = prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=50)
    return f"{title}\n{table}"


def bench_decode(
    device: torch.device, new_tokens: int = 512, reps: int = 3, compile_step: bool = False
) -> dict:
    """Greedy decoding of a short prompt, with the KV cache and recomputing (6/6/384, ctx 1024);
    with ``compile_step``, also with the one-token cache step compiled (compiling untimed)."""
    cfg = ModelConfig(vocab_size=65, n_layer=6, n_head=6, d_model=384, context_length=1024)
    torch.manual_seed(0)
    model = TransformerLM(cfg).to(device).eval()
    prompt = [[1, 2, 3, 4, 5, 6, 7, 8]]
    generate(model, prompt, 8, pad_id=0)  # warm-up: a GPU's first kernels load and autotune
    result = {"new_tokens": new_tokens}
    variants = [("kv_cache", True, False), ("recompute", False, False)]
    if compile_step:
        generate(model, prompt, 8, pad_id=0, compile_step=True)  # compiles, untimed
        variants.append(("kv_cache_compiled", True, True))
    for name, cache, compiled in variants:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            out = generate(
                model, prompt, new_tokens, pad_id=0, use_cache=cache, compile_step=compiled
            )
            times.append(time.perf_counter() - t)
        assert len(out[0]) == new_tokens
        result[f"{name}_tokens_per_s"] = round(new_tokens / statistics.median(times), 1)
    result["speedup"] = result["kv_cache_tokens_per_s"] / result["recompute_tokens_per_s"]
    return result


DECODE_SHAPE = dict(vocab_size=65, n_layer=6, n_head=6, d_model=384, context_length=1024)


def bench_decode_kv(
    device: torch.device, new_tokens: int = 512, reps: int = 3, shape: dict | None = None
) -> list[dict]:
    """Greedy decoding with the KV cache in the Llama-style block (``shape``, default 6/6/384,
    ctx 1024) at ``n_kv_head`` = ``n_head``, ``n_head / 2`` and 1: tokens/s, and the bytes of
    the cache of one sequence of the full context (they fall by ``n_head / n_kv_head``)."""
    shape = shape or DECODE_SHAPE
    heads = shape["n_head"]
    rows = []
    for kv in dict.fromkeys((heads, max(1, heads // 2), 1)):
        if heads % kv:
            continue
        cfg = ModelConfig(**shape, norm="rmsnorm", mlp="swiglu", n_kv_head=kv)
        torch.manual_seed(0)
        model = TransformerLM(cfg).to(device).eval()
        prompt = [[1, 2, 3, 4, 5, 6, 7, 8]]
        generate(model, prompt, 8, pad_id=0)  # warm-up
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            out = generate(model, prompt, new_tokens, pad_id=0)
            times.append(time.perf_counter() - t)
        assert len(out[0]) == new_tokens
        cache = model.new_cache(1, cfg.context_length)
        with torch.no_grad():  # a layer's keys are made at its first store
            model(torch.tensor(prompt, device=device), cache=cache)
        rows.append(
            {
                "n_kv_head": kv,
                "kv_cache_tokens_per_s": round(new_tokens / statistics.median(times), 1),
                "cache_bytes": cache.nbytes,
            }
        )
        del model, cache
    return rows


def bench_tokenize(reps: int = 3) -> dict:
    """BPE (vocab 1024) on the embedded corpus from an empty cache: training the tokenizer and
    tokenizing both splits with ``Dataset.map(batched=True)``, in one process (the tokenizers
    library's own threads) and with two worker processes."""
    result = {}
    for name, num_proc in (("one_process_s", None), ("two_processes_s", 2)):
        times = []
        for _ in range(reps):
            with tempfile.TemporaryDirectory() as cache:
                cfg = DataConfig(
                    tokenizer="bpe", vocab_size=1024, cache_dir=cache, num_proc=num_proc
                )
                t = time.perf_counter()
                prepared = prepare_data(cfg, log=None)
                times.append(time.perf_counter() - t)
        result[name] = round(statistics.median(times), 3)
    result["train_tokens"] = prepared.train.n_tokens
    return result


def table(rows: list[dict]) -> str:
    head = (
        "| shape | position | L/H/d/ctx | params | batch | dtype | compile | ms/step | tokens/s "
        "| MFU | data | faults/step |"
    )
    lines = [head, "|---|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['position']} | {r['layers/heads/width/ctx']} | {r['params_M']}M "
            f"| {r['batch']} "
            f"| {r['dtype']} | {'yes' if r['compile'] else 'no'} | {r['step_ms']} "
            f"| {r['tokens_per_s']:,} | {r['mfu']:.1%} | {r['data_fraction']:.1%} "
            f"| {r['page_faults_per_step']:,} |"
        )
    return "\n".join(lines)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        default=",".join(s for s in SHAPES if s not in EXPERIMENTS),
        help=f"of {', '.join(SHAPES)} (default: all but {' and '.join(EXPERIMENTS)})",
    )
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--steps", type=positive_int, default=10, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--batch", type=positive_int, help="sequences per step (default: each shape's own)"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also torch.compile each shape (and, with --decode, the one-token decoding step)",
    )
    parser.add_argument(
        "--no-train", dest="train", action="store_false", help="no training rows (with --decode)"
    )
    parser.add_argument("--decode", action="store_true", help="also time decoding")
    parser.add_argument(
        "--decode-tokens", type=positive_int, default=512, help="new tokens per decoding"
    )
    parser.add_argument("--tokenize", action="store_true", help="also time BPE tokenizing")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--peak-tflops",
        type=_positive_float,
        help="the peak MFU divides by, in TFLOP/s (default: the datasheet of a known GPU, "
        "else a matmul measured here)",
    )
    parser.add_argument(
        "--malloc-default",
        action="store_true",
        help="leave glibc's malloc thresholds alone (the trainer raises them on CPU)",
    )
    parser.add_argument(
        "--positions", help="position schemes, one row each (default: each shape's own)"
    )
    parser.add_argument(
        "--block",
        action="store_true",
        help="also train each row in the Llama-style block at the GPT-2 block's parameter "
        "count, side by side, and print its tokens/s over the GPT-2 block's",
    )
    parser.add_argument(
        "--decode-kv",
        action="store_true",
        help="also time KV-cache decoding in the Llama-style block at n_kv_head = n_head, "
        "n_head/2 and 1, with each cache's bytes",
    )
    parser.add_argument(
        "--fused-layer-norm",
        action="store_true",
        help="also train each row with PyTorch's fused LayerNorm, side by side (on CPU lm "
        "uses two ops, whose gradient is the same on any number of threads)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also print where each shape's step spends its time: torch.profiler's self time "
        "per op over --steps more steps of its first row",
    )
    parser.add_argument("--out", default="bench.json")
    args = parser.parse_args()
    for name, known in (("--shapes", SHAPES), ("--dtypes", DTYPES), ("--positions", POSITIONS)):
        if getattr(args, name[2:]) is None:
            continue
        unknown = {v.split("+")[0] for v in getattr(args, name[2:]).split(",")} - set(known)
        if unknown:
            parser.error(f"{name}: {', '.join(sorted(unknown))} not among {', '.join(known)}")
    device = resolve_device(args.device)
    if device.type == "cpu" and not args.malloc_default:
        retain_freed_host_memory()  # as the trainer does
    if device.type == "cuda":  # as the trainer does: fp32 matmuls on tensor cores
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    print(f"device: {device_name}, torch {torch.__version__}", file=sys.stderr, flush=True)
    dtypes = args.dtypes.split(",") if args.train else []
    peaks = {d: resolve_peak(d, device, args.peak_tflops) for d in dtypes}
    positions = args.positions.split(",") if args.positions else [None]
    rows, ratios = [], []
    for shape in args.shapes.split(",") if args.train else []:
        for dtype in dtypes:
            for compiled in (False, True) if args.compile else (False,):
                variants = [
                    *positions,
                    *(llama_block(SHAPES[shape][0], p) for p in positions if args.block),
                ]
                runs = [
                    Training(shape, dtype, compiled, device, args.batch, position, fused)
                    for position in variants
                    for fused in ((False, True) if args.fused_layer_norm else (False,))
                ]
                bench_side_by_side(runs, args.steps, args.warmup)
                for run in runs:
                    rows.append(run.row(peaks[dtype]))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                ratios += side_by_side_ratios(runs)
                if args.profile:
                    print(profile_steps(runs[0], args.steps), file=sys.stderr, flush=True)
                del runs
    report: dict = {
        "device": str(device),
        "device_name": device_name,
        "torch": torch.__version__,
        "training": rows,
    }
    if rows:
        print(table(rows) + "\n")
    if ratios:
        report["side_by_side_ratios"] = ratios
        print("\n".join(ratios) + "\n")
    for dtype, (_, source) in peaks.items():
        print(f"MFU peak, {dtype}: {source}")
    if args.decode:
        report["decode"] = bench_decode(device, args.decode_tokens, compile_step=args.compile)
        d = report["decode"]
        compiled = d.get("kv_cache_compiled_tokens_per_s")
        print(
            f"\ndecoding {d['new_tokens']} tokens (6/6/384, ctx 1024): KV cache "
            f"{d['kv_cache_tokens_per_s']} tokens/s, recompute {d['recompute_tokens_per_s']} "
            f"tokens/s, {d['speedup']:.1f}x"
            + ("" if compiled is None else f"; KV cache step compiled {compiled} tokens/s")
        )
    if args.decode_kv:
        report["decode_kv"] = bench_decode_kv(device, args.decode_tokens)
        print(f"\ndecoding {args.decode_tokens} tokens, Llama-style block 6/6/384, ctx 1024:")
        for r in report["decode_kv"]:
            print(
                f"  n_kv_head {r['n_kv_head']}: KV cache {r['kv_cache_tokens_per_s']} tokens/s, "
                f"cache {r['cache_bytes'] / 2**20:.1f} MiB for one sequence of 1024 tokens"
            )
    if args.tokenize:
        report["tokenize"] = t = bench_tokenize()
        print(
            f"\nBPE on the embedded corpus ({t['train_tokens']:,} training tokens), from an empty "
            f"cache: {t['one_process_s']} s in one process, {t['two_processes_s']} s with two"
        )
    with contextlib.suppress(OSError):
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
