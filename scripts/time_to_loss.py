"""Wall-clock time to a target validation loss, for `lm` and (optionally) nanoGPT, side by side.

    python scripts/time_to_loss.py configs/shakespeare_char_cpu.yaml --target 1.88 \
        --set data.source=../shared/data/tinyshakespeare/input.txt --repeats 3 \
        --nanogpt ~/src/nanoGPT --nanogpt-python ~/venvs/nanogpt/bin/python

Each `lm` run is a fresh process, ``lm train CONFIG --set train.target_loss=TARGET``: training
stops at the first evaluation on the whole validation split at or below the target. Its time is
the process's wall time from launch to exit (imports, data, evaluations and the last checkpoint
included). With ``--nanogpt DIR`` the script also runs nanoGPT's documented CPU Shakespeare
command from the user's own checkout (its data prepared by its own ``prepare.py``), alternating
the two programs, and times nanoGPT from launch to the log line of its first evaluation at or
below the target, or to its exit if it never gets there. It prints each run, the medians and the
ratio. No code of nanoGPT is part of this project.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# nanoGPT README's "I only have a macbook" command, which its README reports at val loss ~1.88.
NANOGPT_CPU = (
    "train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 "
    "--log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 "
    "--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0"
)
NANOGPT_EVAL = re.compile(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)")


def run_lm(config: str, overrides: list[str], target: float, out: Path) -> dict:
    cmd = [sys.executable, "-m", "lm", "train", config, "--out", str(out), "--overwrite", "--quiet"]
    cmd += ["--set", f"train.target_loss={target}", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"lm failed: {proc.stderr.strip()[-500:]}")
    evals = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if '"val_loss"' in line
    ]
    hit = next((e for e in evals if e["val_loss"] <= target), None)
    last = hit or evals[-1]
    return {
        "program": "lm",
        "wall_s": wall,
        "reached": hit is not None,
        "step": last["step"],
        "val_loss": last["val_loss"],
        "train_s": last["elapsed_s"],
    }


def run_nanogpt(directory: Path, python: str, target: float) -> dict:
    cmd = [python, "-u", *shlex.split(NANOGPT_CPU)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=directory, stdout=subprocess.PIPE, text=True)
    hit, last = None, None
    for line in proc.stdout:  # timestamps lines as they arrive (-u: unbuffered)
        match = NANOGPT_EVAL.search(line)
        if match:
            step, val = int(match.group(1)), float(match.group(3))
            last = {"step": step, "val_loss": val, "at_s": time.perf_counter() - t0}
            if hit is None and val <= target:
                hit = last
    proc.wait()
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or last is None:
        raise SystemExit("nanoGPT failed; check its checkout and prepared data")
    point = hit or last
    return {
        "program": "nanoGPT",
        "wall_s": point["at_s"] if hit else wall,
        "reached": hit is not None,
        "step": point["step"],
        "val_loss": point["val_loss"],
        "full_run_s": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--target", type=float, default=1.88)
    parser.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout with shakespeare_char")
    parser.add_argument("--nanogpt-python", default=sys.executable)
    parser.add_argument("--json", default="time_to_loss.json")
    args = parser.parse_args()

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            if args.nanogpt:
                runs.append(run_nanogpt(args.nanogpt, args.nanogpt_python, args.target))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
            runs.append(run_lm(args.config, args.overrides, args.target, Path(tmp) / f"r{i}"))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)

    print("| program | runs | reached target | median wall s | median steps | median val loss |")
    print("|---|---:|---:|---:|---:|---:|")
    medians = {}
    for program in ("nanoGPT", "lm"):
        mine = [r for r in runs if r["program"] == program]
        if not mine:
            continue
        medians[program] = statistics.median(r["wall_s"] for r in mine)
        print(
            f"| {program} | {len(mine)} | {sum(r['reached'] for r in mine)}/{len(mine)} "
            f"| {medians[program]:.1f} | {statistics.median(r['step'] for r in mine):.0f} "
            f"| {statistics.median(r['val_loss'] for r in mine):.4f} |"
        )
    if len(medians) == 2:
        pairs = [
            a["wall_s"] / b["wall_s"]
            for a, b in zip(runs[0::2], runs[1::2], strict=True)  # (nanoGPT, lm) pairs in turn
        ]
        ratio = statistics.median(pairs)
        print(
            f"\nlm needs {1 / ratio:.2f}x nanoGPT's wall time ({ratio:.2f}x faster; median of "
            f"{len(pairs)} side-by-side pairs; target {args.target})"
        )
    Path(args.json).write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
