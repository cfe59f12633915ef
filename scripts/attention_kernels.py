"""Masked attention, SDPA with a mask tensor against FlexAttention, side by side in one process.

    python scripts/attention_kernels.py --rounds 3

Times a whole model's forward pass (the shape of the extrapolation experiment: 4
layers, 4 heads, width 128) where attention needs more than the causal mask: ALiBi's distance
bias, and packed windows of several documents. ``model.attention: sdpa`` builds one
``[B, 1|H, T, T]`` mask per forward pass; ``flex`` hands the mask and bias to FlexAttention as
functions, compiled on their own (the model stays eager). On CPU the passes run without
gradients (PyTorch's FlexAttention has no backward pass there); on CUDA each is a forward and
backward pass. Rounds alternate the two kernels; the script prints each one's median and the
median of the per-round ratios. The first calls of each kernel (compiling) are not timed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from lm.cli import positive_int
from lm.config.sections import ModelConfig
from lm.model.transformer import TransformerLM, loss_sum

# (label, position, sequence length, batch, documents per window: 0 = one, no document mask)
CASES = [
    ("alibi, 8x the context", "alibi", 512, 16, 0),
    ("alibi, 4x the context", "alibi", 256, 16, 0),
    ("rope, ~3 documents per window", "rope", 512, 16, 3),
]


def _model(position: str, kernel: str, device: torch.device) -> TransformerLM:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=128, context_length=64, n_layer=4, n_head=4, d_model=128,
        position=position, kernel=kernel,
    )  # fmt: skip
    return TransformerLM(cfg).to(device)


def _inputs(T: int, B: int, docs: int, device: torch.device):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (B, T + 1), generator=g)
    segments = None
    if docs:  # document starts at random places, about `docs` per window
        starts = torch.rand(B, T, generator=g) < docs / T
        segments = starts.long().cumsum(1).to(device)
    return ids.to(device), segments


def _time(model, ids, segments, train: bool, device: torch.device, calls: int) -> float:
    """Median seconds of one pass over ``calls`` timed calls."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        with contextlib.nullcontext() if train else torch.no_grad():
            logits = model(ids[:, :-1], segment_ids=segments)
            if train:
                loss_sum(logits, ids[:, 1:]).backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--calls", type=positive_int, default=5, help="timed calls per round")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    train = device.type == "cuda"
    print(f"{device.type}, {'forward and backward' if train else 'forward, no gradients'}")
    print("| case | sdpa ms | flex ms | sdpa / flex (per round) |")
    print("|---|---:|---:|---|")
    for label, position, T, B, docs in CASES:
        ids, segments = _inputs(T, B, docs, device)
        models = {k: _model(position, k, device) for k in ("sdpa", "flex")}
        for model in models.values():  # compile and warm up, untimed
            _time(model, ids, segments, train, device, 2)
        times: dict[str, list[float]] = {"sdpa": [], "flex": []}
        for r in range(args.rounds):
            order = ("sdpa", "flex") if r % 2 == 0 else ("flex", "sdpa")
            for k in order:
                times[k].append(_time(models[k], ids, segments, train, device, args.calls))
        ratios = [s / f for s, f in zip(times["sdpa"], times["flex"], strict=True)]
        print(
            f"| {label} (T={T}, B={B}) | {statistics.median(times['sdpa']) * 1e3:.1f} | "
            f"{statistics.median(times['flex']) * 1e3:.1f} | {statistics.median(ratios):.2f} "
            f"({', '.join(f'{x:.2f}' for x in ratios)}) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
