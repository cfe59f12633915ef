"""Training and decoding throughput of `lm`, against this machine's own measured matmul peak.

    python scripts/bench.py                       # every shape, fp32 and bf16
    python scripts/bench.py --shapes nanogpt-cpu --dtypes fp32 --steps 30
    python scripts/bench.py --decode              # KV cache against recomputing, 512 tokens
    python scripts/bench.py --shapes nanogpt-cpu --dtypes fp32 --tokenize  # and BPE tokenizing
    python scripts/bench.py --shapes nanogpt-cpu --dtypes fp32 --malloc-default  # glibc as is

For each shape and dtype it times full optimizer steps (the trainer's own data path, forward,
loss, backward, clipping, AdamW) on random tokens after a warm-up, and reports tokens/s and MFU:
model FLOPs per token (6N + 12 L d T) times tokens/s, over the peak of a large matmul measured in
the same process with the same dtype, and the page faults a step costs. It prints a Markdown
table and writes JSON. Run it alone:
on a shared two-core machine any other load stalls steps by far more than 2x.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lm.batches import TrainBatches
from lm.config import DataConfig, ModelConfig, TrainConfig
from lm.data import TokenizedSplit, prepare_data
from lm.distributed import World
from lm.model import TransformerLM
from lm.optim import build_optimizer
from lm.runtime import autocast_context, compile_model, resolve_device, retain_freed_host_memory
from lm.sample import generate
from lm.step import Stepper

# name: (model shape, sequences per step)
SHAPES: dict[str, tuple[dict, int]] = {
    "nanogpt-cpu": (
        dict(n_layer=4, n_head=4, d_model=128, context_length=64, position="learned"),
        12,
    ),
    "shakespeare-gpu": (dict(n_layer=6, n_head=6, d_model=384, context_length=256), 16),
    "gpt2-small": (
        dict(n_layer=12, n_head=12, d_model=768, context_length=1024, vocab_size=50304),
        4,
    ),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def matmul_peak(dtype: torch.dtype, device: torch.device, n: int = 2048, reps: int = 8) -> float:
    """FLOP/s of an n x n matmul in ``dtype``: the best of ``reps`` (the machine's ceiling)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def random_split(vocab: int, n_tokens: int, seed: int = 0) -> TokenizedSplit:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=n_tokens, dtype=np.int64).astype(np.uint32)
    return TokenizedSplit(tokens=tokens, offsets=np.array([0, n_tokens], dtype=np.int64))


def bench_training(
    shape: str, dtype_name: str, steps: int, warmup: int, compiled: bool, device: torch.device
) -> dict:
    model_kw, batch = SHAPES[shape]
    cfg = ModelConfig(**{"vocab_size": 65, **model_kw})
    torch.manual_seed(0)
    model = TransformerLM(cfg).to(device)
    tc = TrainConfig(batch_size=batch, lr=1e-3, grad_clip=1.0)
    optimizer = build_optimizer(model, tc, device)
    runner = compile_model(model, device) if compiled else model
    dtype = DTYPES[dtype_name]
    stepper = Stepper(
        runner, model, optimizer, torch.amp.GradScaler(device.type, enabled=False),
        autocast_context(device, dtype), World(), device, tc.grad_clip,
    )  # fmt: skip
    split = random_split(cfg.vocab_size, 200_000)
    batches = TrainBatches(split, DataConfig(), cfg.context_length, batch, 1, 0, seed=0)

    step_times, data_times = [], []
    for step in range(warmup + steps):
        if step == warmup:
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        micro, n_targets = batches.step(step)
        t1 = time.perf_counter()
        loss = stepper.forward_backward(micro, n_targets)
        stepper.update(loss)  # reads the norm: the step has finished on the device
        t2 = time.perf_counter()
        if step >= warmup:
            data_times.append(t1 - t0)
            step_times.append(t2 - t0)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / steps
    step_s = statistics.median(step_times)
    tokens = batch * cfg.context_length
    peak = matmul_peak(dtype, device)
    tok_s = tokens / step_s
    return {
        "shape": shape,
        "layers/heads/width/ctx": f"{cfg.n_layer}/{cfg.n_head}/{cfg.d_model}/{cfg.context_length}",
        "params_M": round(model.num_parameters() / 1e6, 2),
        "batch": batch,
        "dtype": dtype_name,
        "compile": compiled,
        "step_ms": round(step_s * 1e3, 2),
        "tokens_per_s": round(tok_s),
        "mfu": tok_s * model.flops_per_token(cfg.context_length) / peak,
        "peak_tflops": peak / 1e12,
        "data_fraction": statistics.median(data_times) / step_s,
        "page_faults_per_step": round(faults),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def bench_decode(device: torch.device, new_tokens: int = 512, reps: int = 3) -> dict:
    """Greedy decoding of a short prompt, with the KV cache and recomputing (6/6/384, ctx 1024)."""
    cfg = ModelConfig(vocab_size=65, n_layer=6, n_head=6, d_model=384, context_length=1024)
    torch.manual_seed(0)
    model = TransformerLM(cfg).to(device).eval()
    prompt = [[1, 2, 3, 4, 5, 6, 7, 8]]
    result = {}
    for name, cache in (("kv_cache", True), ("recompute", False)):
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            out = generate(model, prompt, new_tokens, pad_id=0, use_cache=cache)
            times.append(time.perf_counter() - t)
        assert len(out[0]) == new_tokens
        result[f"{name}_tokens_per_s"] = round(new_tokens / statistics.median(times), 1)
    result["speedup"] = result["kv_cache_tokens_per_s"] / result["recompute_tokens_per_s"]
    return result


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
        "| shape | L/H/d/ctx | params | batch | dtype | compile | ms/step | tokens/s | MFU | data "
        "| faults/step |"
    )
    lines = [head, "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['layers/heads/width/ctx']} | {r['params_M']}M | {r['batch']} "
            f"| {r['dtype']} | {'yes' if r['compile'] else 'no'} | {r['step_ms']} "
            f"| {r['tokens_per_s']:,} | {r['mfu']:.1%} | {r['data_fraction']:.1%} "
            f"| {r['page_faults_per_step']:,} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also torch.compile each shape")
    parser.add_argument("--decode", action="store_true", help="also time decoding")
    parser.add_argument("--tokenize", action="store_true", help="also time BPE tokenizing")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--malloc-default",
        action="store_true",
        help="leave glibc's malloc thresholds alone (the trainer raises them on CPU)",
    )
    parser.add_argument("--out", default="bench.json")
    args = parser.parse_args()
    device = resolve_device(args.device)
    if device.type == "cpu" and not args.malloc_default:
        retain_freed_host_memory()  # as the trainer does
    rows = []
    for shape in args.shapes.split(","):
        for dtype in args.dtypes.split(","):
            for compiled in (False, True) if args.compile else (False,):
                row = bench_training(shape, dtype, args.steps, args.warmup, compiled, device)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    report: dict = {"device": str(device), "torch": torch.__version__, "training": rows}
    print(table(rows))
    peaks = {r["dtype"]: r["peak_tflops"] for r in rows}
    print("\nmeasured matmul peak: " + ", ".join(f"{k} {v:.3f} TFLOP/s" for k, v in peaks.items()))
    if args.decode:
        report["decode"] = bench_decode(device)
        d = report["decode"]
        print(
            f"\ndecoding 512 tokens (6/6/384, ctx 1024): KV cache {d['kv_cache_tokens_per_s']} "
            f"tokens/s, recompute {d['recompute_tokens_per_s']} tokens/s, {d['speedup']:.1f}x"
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
