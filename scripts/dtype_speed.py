"""fp32 against bf16 autocast, training steps side by side per model width: the figures behind
``train.dtype: auto``'s rule (``lm.runtime.device.auto_rule``).

    python scripts/dtype_speed.py                       # widths 64..768: 4 layers, 16 x 64 tokens
    python scripts/dtype_speed.py --widths 128 --optimizer muon --attention math --rounds 60

For each width it builds the same model twice (same initial weights) and runs full training steps
(the trainer's own Stepper: forward, loss, backward, clipping, optimizer) of the fp32 one and the
bf16-autocast one in turn, so that a machine whose speed drifts slows both alike; it prints the
median time of each and the median and spread of the per-round ratios. It also prints the CPU's
bf16 instructions and what ``train.dtype: auto`` picks at each width here with that kernel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from lm.cli import positive_int
from lm.config.sections import DataConfig, ModelConfig, TrainConfig
from lm.data.batches import TrainBatches
from lm.data.sources import TokenizedSplit
from lm.model.transformer import TransformerLM
from lm.runtime.device import autocast_context, cpu_bf16_kind, resolve_dtype
from lm.runtime.distributed import World
from lm.runtime.host import retain_freed_host_memory
from lm.training.optim import build_optimizer
from lm.training.step import Stepper

VOCAB = 65  # Tiny Shakespeare's characters


def stepper(model_cfg: ModelConfig, train_cfg: TrainConfig, dtype: torch.dtype) -> Stepper:
    torch.manual_seed(0)
    model = TransformerLM(model_cfg)
    cpu = torch.device("cpu")
    optimizer = build_optimizer(model, train_cfg, cpu)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return Stepper(model, model, optimizer, scaler, autocast_context(cpu, dtype), World(), cpu, 1.0)


def compare(width: int, args: argparse.Namespace) -> dict:
    """Median ms/step of fp32 and bf16 at one width, and the per-round ratios fp32/bf16."""
    model_cfg = ModelConfig(
        vocab_size=VOCAB, n_layer=args.layers, n_head=max(1, width // 32), d_model=width,
        context_length=args.context, position=args.position, kernel=args.attention,
        dropout=0.0,
    )  # fmt: skip
    train_cfg = TrainConfig(batch_size=args.batch, optimizer=args.optimizer, lr=1e-3)
    tokens = np.random.default_rng(0).integers(0, VOCAB, 200_000).astype(np.uint16)
    split = TokenizedSplit(tokens, np.array([0, len(tokens)], dtype=np.int64))
    batches = TrainBatches(split, DataConfig(), args.context, args.batch, 1, 0, seed=0)
    runs = {"fp32": stepper(model_cfg, train_cfg, torch.float32)}
    runs["bf16"] = stepper(model_cfg, train_cfg, torch.bfloat16)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(args.warmup + args.rounds):
        micro, n_targets = batches.step(step)
        order = list(runs) if step % 2 == 0 else list(reversed(runs))  # neither always first
        for name in order:
            t = time.perf_counter()
            runs[name].update(runs[name].forward_backward(micro, n_targets))
            if step >= args.warmup:
                times[name].append(time.perf_counter() - t)
    ratios = [a / b for a, b in zip(times["fp32"], times["bf16"], strict=True)]
    auto = resolve_dtype("auto", torch.device("cpu"), model_cfg)
    return {
        "width": width,
        "fp32_ms": statistics.median(times["fp32"]) * 1e3,
        "bf16_ms": statistics.median(times["bf16"]) * 1e3,
        "ratio": statistics.median(ratios),
        "ratio_q1_q3": statistics.quantiles(ratios, n=4)[::2],
        "auto": "bf16" if auto == torch.bfloat16 else "fp32",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="64,128,256,384,512,768")
    parser.add_argument("--layers", type=positive_int, default=4)
    parser.add_argument("--context", type=positive_int, default=64)
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--position", default="rope")
    parser.add_argument("--attention", default="sdpa", choices=("sdpa", "math"))
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "muon"))
    parser.add_argument("--rounds", type=positive_int, default=30, help="timed steps of each")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    try:
        widths = [positive_int(w) for w in args.widths.split(",")]
    except argparse.ArgumentTypeError as e:
        parser.error(f"--widths: {e}")
    retain_freed_host_memory()  # as the trainer does on CPU
    print(
        f"CPU bf16: {cpu_bf16_kind()}; capability {torch.backends.cpu.get_cpu_capability()}; "
        f"{torch.get_num_threads()} threads; torch {torch.__version__}",
        file=sys.stderr,
    )
    print("| width | fp32 ms/step | bf16 ms/step | fp32/bf16 (median, quartiles) | auto picks |")
    print("|---:|---:|---:|---|---|")
    for width in widths:
        r = compare(width, args)
        q1, q3 = r["ratio_q1_q3"]
        print(
            f"| {width} | {r['fp32_ms']:.2f} | {r['bf16_ms']:.2f} | {r['ratio']:.2f} "
            f"({q1:.2f}-{q3:.2f}) | {r['auto']} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
