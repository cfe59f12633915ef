"""How much a run's attention fades when a query sees many more keys than it trained with: the
premise of Scalable-Softmax (Nakanishi 2025), measured on trained runs.

A softmax over n keys spreads thinner as n grows unless the scores grow too: a query that
spreads evenly has entropy ln n, so from the trained context C to 8C an evenly spread head gains
ln 8 = 2.08 nats. SSMax scales the scores by ``s ln n`` to keep attention as sharp at any n. For
each run this reads validation windows 8 times the trained context and, per layer and head,
compares the queries that see at most C keys (positions C/2 .. C-1) with those that see 7C to 8C
(the last eighth): their mean attention entropy in nats, and the weight the far queries put on
keys further back than C (where no trained query ever looked).

    python scripts/attention_fading.py runs/schemes/position=rope/seed1 \\
        "runs/schemes/position=rope, normalize=ssmax/seed1" --windows 4

Every number is the model's own (``lm.explorer.maps.attention_maps``, the explicit formula with
the run's normalization), averaged over the windows, layers and heads, and printed as a
Markdown table.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from lm.api import load
from lm.config.errors import LMError
from lm.data.sources import prepare_data
from lm.explorer.maps import attention_maps


def fading(run_dir: str, factor: int, windows: int) -> dict[str, float]:
    """A run's mean entropies near and far, and its far queries' weight past the context."""
    run = load(run_dir, device="cpu")
    context = run.config.model.context_length
    length = factor * context
    tokens = prepare_data(run.config.data, log=None).val.tokens
    if len(tokens) < windows * length:
        raise LMError(f"{run_dir}: the validation split holds fewer than {windows} windows")
    near, far, beyond = [], [], []
    for w in range(windows):
        ids = [int(t) for t in tokens[w * length : (w + 1) * length]]
        maps = attention_maps(run.model, ids)  # (layers, heads, T, T)
        safe = np.where(maps > 0, maps, 1.0)
        rows = -(maps * np.log(safe)).sum(-1)  # (layers, heads, T): each query's entropy
        near.append(rows[..., context // 2 : context].mean())
        far.append(rows[..., length - context :].mean())
        queries = np.arange(length - context, length)
        keys = np.arange(length)
        past = keys[None, :] < (queries[:, None] - context + 1)  # further back than C
        beyond.append((maps[..., length - context :, :] * past).sum(-1).mean())
    return {
        "near": float(np.mean(near)),
        "far": float(np.mean(far)),
        "beyond": float(np.mean(beyond)),
        "context": context,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--factor", type=int, default=8, help="windows this many contexts long")
    parser.add_argument("--windows", type=int, default=4)
    args = parser.parse_args()
    if args.factor < 2 or args.windows < 1:
        sys.exit("attention_fading.py: --factor must be at least 2 and --windows at least 1")
    even = np.log(args.factor)
    print(
        f"| run | entropy, queries seeing at most C keys | entropy, queries seeing "
        f"{args.factor - 1}C-{args.factor}C keys | gain (an even spread gains {even:.2f}) | "
        f"far queries' weight further back than C |"
    )
    print("|---|---:|---:|---:|---:|")
    for run in args.runs:
        try:
            f = fading(run, args.factor, args.windows)
        except LMError as e:
            sys.exit(f"attention_fading.py: {e}")
        print(
            f"| {run} | {f['near']:.3f} | {f['far']:.3f} | {f['far'] - f['near']:+.3f} | "
            f"{f['beyond']:.3f} |"
        )


if __name__ == "__main__":
    main()
