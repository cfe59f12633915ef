"""How much a run's attention fades when a query sees many more keys than it trained with: the
premise of Scalable-Softmax (Nakanishi 2025), measured on trained runs.

A softmax over n keys spreads thinner as n grows unless the scores grow too: a query that
spreads evenly has entropy ln n, so from the trained context C to 8C an evenly spread head gains
ln 8 = 2.08 nats. SSMax scales the scores by ``s ln n`` to keep attention as sharp at any n. For
each run this reads validation windows 8 times the trained context and, per layer and head,
compares the queries that see at most C keys (positions C/2 .. C-1) with those that see 7C to 8C
(the last eighth): their mean attention entropy in nats, and the weight the far queries put on
keys further back than C (where no trained query ever looked).

    python scripts/attention_fading.py runs/fading --table docs/extrapolation/fading/fading.md

Every number is the model's own (``lm.explorer.maps.attention_maps``, the explicit formula with
the run's normalization), averaged over the windows, layers and heads; a sweep's seeds of one
setting make one row, mean ± std over them, printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from lm.api import load
from lm.compare.sweep import find_runs
from lm.config.errors import LMError
from lm.data.sources import prepare_data
from lm.explorer.maps import attention_maps


def measure(maps: np.ndarray, context: int) -> tuple[float, float, float]:
    """Of attention maps ``[..., T, T]`` over one window: the mean entropy in nats of the
    queries that see at most ``context`` keys (positions ``context/2 .. context-1``), that of
    the last ``context`` queries, and the weight those put on keys further back than
    ``context - 1`` (distances no trained query had)."""
    length = maps.shape[-1]
    safe = np.where(maps > 0, maps, 1.0)
    rows = -(maps * np.log(safe)).sum(-1)  # (..., T): each query's entropy
    queries, keys = np.arange(length - context, length), np.arange(length)
    past = keys[None, :] <= queries[:, None] - context  # distance q - k of context or more
    beyond = (maps[..., length - context :, :] * past).sum(-1)
    return (
        float(rows[..., context // 2 : context].mean()),
        float(rows[..., length - context :].mean()),
        float(beyond.mean()),
    )


def fading(run_dir: str, factor: int, windows: int) -> dict[str, float]:
    """A run's mean entropies near and far, and its far queries' weight past the context, over
    ``windows`` validation windows of ``factor`` contexts."""
    run = load(run_dir, device="cpu")
    context = run.config.model.context_length
    length = factor * context
    tokens = prepare_data(run.config.data, log=None).val.tokens
    if len(tokens) < windows * length:
        raise LMError(f"{run_dir}: the validation split holds fewer than {windows} windows")
    found = [
        measure(attention_maps(run.model, [int(t) for t in tokens[w * length : (w + 1) * length]]),
                context)
        for w in range(windows)
    ]  # fmt: skip
    near, far, beyond = (float(np.mean(values)) for values in zip(*found, strict=True))
    return {"near": near, "far": far, "beyond": beyond}


def _cell(values: list[float], signed: bool = False) -> str:
    """Mean ± std over seeds (the mean alone for one run)."""
    mean = statistics.mean(values)
    text = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    return f"{text} ± {statistics.stdev(values):.3f}" if len(values) > 1 else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="runs, or folders of runs (a sweep's --out)")
    parser.add_argument("--factor", type=int, default=8, help="windows this many contexts long")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--table", help="also write the table to this file")
    args = parser.parse_args()
    if args.factor < 2 or args.windows < 1:
        sys.exit("attention_fading.py: --factor must be at least 2 and --windows at least 1")
    try:
        runs = find_runs(args.runs)
        groups: dict[str, list[dict[str, float]]] = {}
        for run in runs:  # a sweep's seeds of one setting are one row
            name = run.parent.name if run.name.startswith("seed") else str(run)
            groups.setdefault(name, []).append(fading(str(run), args.factor, args.windows))
    except LMError as e:
        sys.exit(f"attention_fading.py: {e}")
    even = np.log(args.factor)
    lines = [
        f"| runs | seeds | entropy, queries seeing at most C keys | entropy, queries seeing "
        f"{args.factor - 1}C-{args.factor}C keys | gain (an even spread gains {even:.2f}) | "
        f"far queries' weight further back than C |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, found in groups.items():
        near, far = [f["near"] for f in found], [f["far"] for f in found]
        gain = [b - a for a, b in zip(near, far, strict=True)]
        lines.append(
            f"| {name} | {len(found)} | {_cell(near)} | {_cell(far)} | {_cell(gain, True)} | "
            f"{_cell([f['beyond'] for f in found])} |"
        )
    print("\n".join(lines))
    if args.table:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
