"""Training throughput of `lm` and nanoGPT at nanoGPT's CPU Shakespeare shape, side by side.

    python scripts/throughput_vs_nanogpt.py --nanogpt ~/src/nanoGPT \
        --nanogpt-python ~/venvs/nanogpt/bin/python \
        --data ../shared/data/tinyshakespeare/input.txt --repeats 3

Same shape and math on both sides: 4 layers, 4 heads, width 128, context 64, batch 12, learned
absolute positions, fp32, no dropout, no compile. The two programs alternate; each runs
``--iters`` optimizer steps and reports per-step times (nanoGPT's own log lines, one per step;
`lm`'s metrics.jsonl, one per 10 steps: each program's usual logging), of which the first
``--warmup`` steps are dropped. Prints medians in tokens/s
and the ratio. nanoGPT runs from the user's own checkout; none of its code is in this project.
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
from pathlib import Path

TOKENS_PER_STEP = 12 * 64
LM_LOG = 10  # lm's metrics.jsonl line every 10 steps, its usual logging
NANOGPT = (
    "train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=1 "
    "--eval_interval=100000 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 "
    "--n_head=4 --n_embd=128 --dropout=0.0 --max_iters={iters} --lr_decay_iters={iters}"
)
LM_SET = [
    "model.n_layer=4", "model.n_head=4", "model.d_model=128", "model.context_length=64",
    "model.position=learned", "model.dropout=0.0", "train.batch_size=12", "train.dtype=fp32",
    "train.compile=false", "train.eval_every=0", "train.eval_steps=1", f"train.log_every={LM_LOG}",
    "train.checkpoint_every=0", "train.device=cpu", "data.tokenizer=char",
]  # fmt: skip
ITER = re.compile(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms")


def nanogpt_steps(directory: Path, python: str, iters: int) -> list[float]:
    cmd = [python, *shlex.split(NANOGPT.format(iters=iters))]
    out = subprocess.run(cmd, cwd=directory, capture_output=True, text=True, check=True)
    return [float(m.group(2)) / 1e3 for m in ITER.finditer(out.stdout)]


def lm_steps(data: str, iters: int, out: Path) -> list[float]:
    cmd = [sys.executable, "-m", "lm", "train", "configs/default.yaml", "--out", str(out)]
    cmd += ["--overwrite", "--quiet", "--set", f"data.source={data}", f"train.max_steps={iters}"]
    subprocess.run([*cmd, *LM_SET], check=True, capture_output=True)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [TOKENS_PER_STEP / m["tokens_per_s"] for m in lines if "tokens_per_s" in m]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, required=True)
    parser.add_argument("--nanogpt-python", default=sys.executable)
    parser.add_argument("--data", required=True, help="Tiny Shakespeare input.txt")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30, help="steps dropped as warm-up")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    medians: dict[str, list[float]] = {"nanoGPT": [], "lm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            a = nanogpt_steps(args.nanogpt, args.nanogpt_python, args.iters)[args.warmup :]
            b = lm_steps(args.data, args.iters, Path(tmp) / f"r{i}")[args.warmup // LM_LOG :]
            medians["nanoGPT"].append(statistics.median(a))
            medians["lm"].append(statistics.median(b))
            print(
                f"pair {i + 1}: nanoGPT {medians['nanoGPT'][-1] * 1e3:.2f} ms/step, "
                f"lm {medians['lm'][-1] * 1e3:.2f} ms/step",
                file=sys.stderr,
                flush=True,
            )
    ratios = [a / b for a, b in zip(medians["nanoGPT"], medians["lm"], strict=True)]
    print("| program | median ms/step | tokens/s |")
    print("|---|---:|---:|")
    for name, values in medians.items():
        ms = statistics.median(values)
        print(f"| {name} | {ms * 1e3:.2f} | {TOKENS_PER_STEP / ms:,.0f} |")
    print(f"\nlm tokens/s / nanoGPT tokens/s = {statistics.median(ratios):.2f} "
          f"(median of {len(ratios)} side-by-side pairs, pairs: "
          + ", ".join(f"{r:.2f}" for r in ratios) + ")")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
