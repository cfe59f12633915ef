"""Fine-tuning RoPE runs to a longer context, with Position Interpolation and without (the
control), from every seed of the extrapolation experiment (docs/extrapolation.md); prints the
loss at each evaluation length as mean ± std over the seeds.

    python scripts/extend_context.py --runs runs/extrapolation --out runs/extend \
        [--steps N] [--table docs/extrapolation/extensions/fine-tuning.md]

For each seed folder ``RUNS/position=rope/seedN`` it runs, with ``lm`` itself:

    lm train configs/extrapolation_pi.yaml --init-from RUNS/position=rope/seedN \\
        --out OUT/pi/seedN                                   # rope_scaling: pi:4
    lm train configs/extrapolation_pi.yaml --init-from RUNS/position=rope/seedN \\
        --out OUT/control/seedN --set model.rope_scaling=none  # the same steps, no interpolation
    lm eval RUN --context-lengths 64,96,128,192,256,512      # each of the above, and the seed

``--steps N`` fine-tunes N steps instead of the config's 200 (both rows). A fine-tuned run
already complete in OUT (its final checkpoint there) is evaluated again, not
retrained.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from lm.config.load import load_config
from lm.runs.checkpoint import checkpoint_name

LENGTHS = "64,96,128,192,256,512"
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "extrapolation_pi.yaml"


def variants(steps: int) -> dict[str, list[str] | None]:
    """Each row's name and its fine-tuning's settings (None: the run as trained, not tuned)."""
    return {
        "RoPE as trained at 64": None,
        f"+ PI:4, {steps} steps at 256": ["pi", f"train.max_steps={steps}"],
        f"+ {steps} steps at 256, no interpolation": [
            "control",
            f"train.max_steps={steps}",
            "model.rope_scaling=none",
        ],
    }


def _lm(*args: str) -> None:
    """``lm ARGS`` in this interpreter; stops the script if it fails."""
    done = subprocess.run([sys.executable, "-m", "lm", *args])
    if done.returncode:
        sys.exit(f"extend_context: lm {' '.join(args)} failed (exit {done.returncode})")


def _losses(run: Path) -> dict[int, float]:
    """Evaluates ``run`` at every length and returns {length: loss}."""
    _lm("eval", str(run), "--context-lengths", LENGTHS)
    rows = json.loads((run / "eval.json").read_text())["rows"]
    return {r["context_length"]: r["loss"] for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=Path("runs/extrapolation"))
    ap.add_argument("--out", type=Path, default=Path("runs/extend"))
    ap.add_argument("--table", type=Path, help="also write the table to this Markdown file")
    ap.add_argument("--steps", type=int, help="fine-tuning steps (default: the config's, 200)")
    args = ap.parse_args()
    seeds = sorted((args.runs / "position=rope").glob("seed*"))
    if not seeds:
        sys.exit(f"extend_context: no RoPE runs under {args.runs}/position=rope (run lm compare)")
    steps = args.steps or load_config(CONFIG).train.max_steps
    final = checkpoint_name(steps)  # a run trained to the end
    rows = variants(steps)
    table: dict[str, list[dict[int, float]]] = {name: [] for name in rows}
    for seed in seeds:
        for name, tuned in rows.items():
            if tuned is None:
                table[name].append(_losses(seed))
                continue
            out = args.out / tuned[0] / seed.name
            if not (out / "checkpoints" / final).is_dir():
                _lm(
                    "train",
                    str(CONFIG),
                    "--init-from",
                    str(seed),
                    "--out",
                    str(out),
                    "--set",
                    *tuned[1:],
                )
            table[name].append(_losses(out))
    lengths = sorted(table[next(iter(rows))][0])
    lines = [
        f"| {len(seeds)} seeds | " + " | ".join(f"@{n}" for n in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    for name, per_seed in table.items():
        cells = []
        for n in lengths:
            x = [s[n] for s in per_seed]
            spread = statistics.stdev(x) if len(x) > 1 else 0.0
            cells.append(f"{statistics.mean(x):.4f} ± {spread:.4f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    print("\nloss, mean ± std over the seeds\n" + "\n".join(lines))
    if args.table:
        args.table.write_text(
            "# Fine-tuning to 4x the context\n\nWritten by `python scripts/extend_context.py`: "
            "validation loss, mean ± std over the seeds.\n\n" + "\n".join(lines) + "\n",
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
