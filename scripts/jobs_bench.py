"""Whole sweeps with ``--jobs 1`` and ``--jobs auto``, in turn, each from a fresh run folder and
an empty choices cache (what a first sweep of its shape pays, its timing included): the wall
times, their ratio, pair by pair, and whether both trained the same numbers.

    python scripts/jobs_bench.py                     # the three shapes of docs/sweeps.md
    python scripts/jobs_bench.py --shapes flipflop --repeats 3

Run it alone on the machine: a benchmark beside other work measures that work.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    # The main job's shape: three schemes of configs/default.yaml, 150 steps each.
    "main": "configs/default.yaml --vary model.position=rope,alibi,none "
    "--set train.max_steps=150 train.eval_every=0",
    # Three 300-step runs of the copy task: a sweep shorter than measuring it would be.
    "copy": "configs/copy.yaml --vary model.position=rope,alibi,none --set train.max_steps=300",
    # The flip-flop experiment's shape: its first four schemes, 400 steps each.
    "flipflop": "configs/flipflop.yaml --vary model.position=rope,learned,alibi,cope "
    "--set train.max_steps=400",
}


def sweep(shape: str, jobs: str, root: Path) -> tuple[float, dict[str, list]]:
    """One sweep's wall seconds, and each run's logged losses."""
    out, cache = root / f"{shape}-{jobs}", root / f"cache-{shape}-{jobs}"
    for folder in (out, cache):
        shutil.rmtree(folder, ignore_errors=True)
    argv = ["lm", "compare", *SHAPES[shape].split(), "--jobs", jobs, "--out", str(out)]
    env = {**os.environ, "LM_CACHE": str(cache)}
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stderr}")
    said = [line for line in done.stderr.splitlines() if "--jobs auto" in line]
    if said:
        print(f"  {said[0]}", flush=True)
    losses = {}
    for metrics in sorted(out.glob("*/*/metrics.jsonl")):
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        losses[metrics.parent.parent.name] = [
            r.get("train_loss", r.get("val_loss")) for r in rows if "step" in r
        ]
    return seconds, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="of: " + ", ".join(SHAPES))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        sys.exit(f"jobs_bench.py: unknown shape {unknown[0]!r} (known: {', '.join(SHAPES)})")
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="jobs-bench-") as folder:
        root = Path(folder)
        for repeat in range(args.repeats):
            for shape in shapes:
                # Interleaved, the order swapped each repeat: drift falls on both alike.
                order = ("1", "auto") if repeat % 2 == 0 else ("auto", "1")
                losses = {}
                for jobs in order:
                    seconds, losses[jobs] = sweep(shape, jobs, root)
                    times.setdefault((shape, jobs), []).append(seconds)
                    print(f"{shape} --jobs {jobs}: {seconds:.1f} s", flush=True)
                same = losses["1"] == losses["auto"]
                print(f"{shape}: the same losses in both: {same}", flush=True)
    print("\n| sweep | --jobs 1 (s) | --jobs auto (s) | one at a time / auto |")
    print("|---|---:|---:|---:|")
    for shape in shapes:
        one, auto = times[(shape, "1")], times[(shape, "auto")]
        ratios = [a / b for a, b in zip(one, auto, strict=True)]
        print(
            f"| {shape} | {', '.join(f'{t:.1f}' for t in one)} | "
            f"{', '.join(f'{t:.1f}' for t in auto)} | {statistics.median(ratios):.2f}x |"
        )


if __name__ == "__main__":
    main()
