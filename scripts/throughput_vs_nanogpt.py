"""Training throughput of `lm` and nanoGPT at nanoGPT's CPU Shakespeare shape, side by side.

    python scripts/throughput_vs_nanogpt.py --nanogpt ~/src/nanoGPT \
        --nanogpt-python ~/venvs/nanogpt/bin/python \
        --data ../shared/data/tinyshakespeare/input.txt --repeats 5 --compile

Same shape and math on both sides: 4 layers, 4 heads, width 128, context 64, batch 12, learned
absolute positions, fp32, no dropout. nanoGPT runs its README's CPU command (which turns compile
off); `lm` runs eager (its CPU default). With ``--compile`` both also run compiled (nanoGPT's
``--compile=True``, `lm`'s ``train.compile=true``), so every ratio has a like-for-like partner.

Each repeat runs every program once, in an order rotated from repeat to repeat; each runs
``--iters`` optimizer steps and reports per-step times (nanoGPT's own log lines, one per step;
`lm`'s metrics.jsonl, one per 10 steps: each program's usual logging), of which the first
``--warmup`` steps (compiling included) are dropped. Prints each program's median and the
ratios of medians taken within each repeat; wall time per process shows the start-up cost.
nanoGPT runs from the user's own checkout; none of its code is in this project.

With ``--in-process`` the two training steps instead run in this one process, a step of each in
turn (the order swapped every step), so that a host whose speed drifts slows both alike: nanoGPT's
``GPT`` and ``configure_optimizers`` imported from the checkout's ``model.py``, its step as its
``train.py`` takes it on CPU (a batch cut from its ``train.bin`` memmap, forward with targets,
backward, clipping at 1.0, AdamW, ``zero_grad``), against `lm`'s step as ``scripts/bench.py``
times it. Both programs' start-up, logging and evaluation are left out; the process keeps
freed memory as `lm`'s trainer does, which helps nanoGPT's step here more than in its own run.
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

TOKENS_PER_STEP = 12 * 64
LM_LOG = 10  # lm's metrics.jsonl line every 10 steps, its usual logging
NANOGPT = (
    "train.py config/train_shakespeare_char.py --device=cpu --compile={compile} --eval_iters=1 "
    "--eval_interval=100000 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 "
    "--n_head=4 --n_embd=128 --dropout=0.0 --max_iters={iters} --lr_decay_iters={iters}"
)
LM_SET = [
    "model.n_layer=4", "model.n_head=4", "model.d_model=128", "model.context_length=64",
    "model.position=learned", "model.dropout=0.0", "train.batch_size=12", "train.dtype=fp32",
    "train.eval_every=0", "train.eval_steps=1", f"train.log_every={LM_LOG}",
    "train.checkpoint_every=0", "train.device=cpu", "data.tokenizer=char",
]  # fmt: skip
ITER = re.compile(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms")


def nanogpt_steps(args: argparse.Namespace, compiled: bool, out: Path) -> list[float]:
    """Seconds per step after the warm-up, from nanoGPT's log line of every step."""
    cmd = [args.nanogpt_python, *shlex.split(NANOGPT.format(iters=args.iters, compile=compiled))]
    run = subprocess.run(cmd, cwd=args.nanogpt, capture_output=True, text=True, check=True)
    return [float(m.group(2)) / 1e3 for m in ITER.finditer(run.stdout)][args.warmup :]


def lm_steps(args: argparse.Namespace, compiled: bool, out: Path) -> list[float]:
    """Seconds per step after the warm-up, from metrics.jsonl (a line every LM_LOG steps)."""
    cmd = [sys.executable, "-m", "lm", "train", "configs/default.yaml", "--out", str(out)]
    cmd += ["--overwrite", "--quiet", "--set", f"data.source={args.data}"]
    cmd += [f"train.max_steps={args.iters}", *LM_SET, f"train.compile={str(compiled).lower()}"]
    subprocess.run(cmd, check=True, capture_output=True)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    times = [TOKENS_PER_STEP / m["tokens_per_s"] for m in lines if "tokens_per_s" in m]
    return times[args.warmup // LM_LOG :]


def in_process(args: argparse.Namespace) -> int:
    """nanoGPT's step and lm's, in turn in this process: medians and the step-by-step ratio."""
    import numpy as np
    import torch
    from bench import Training  # scripts/bench.py: lm's own training step, timed

    from lm.runtime.host import retain_freed_host_memory

    sys.path.insert(0, str(args.nanogpt))
    from model import GPT, GPTConfig  # nanoGPT's model.py, from the user's checkout

    retain_freed_host_memory()
    torch.manual_seed(0)
    shape = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, bias=False)
    gpt = GPT(GPTConfig(vocab_size=65, **shape))
    optimizer = gpt.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    train_bin = args.nanogpt / "data" / "shakespeare_char" / "train.bin"
    batch, block = 12, 64

    def nanogpt_step() -> float:
        t0 = time.perf_counter()
        data = np.memmap(train_bin, dtype=np.uint16, mode="r")  # reopened per batch, as it does
        starts = torch.randint(len(data) - block, (batch,)).tolist()
        x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in starts])
        y = torch.stack(
            [torch.from_numpy(data[i + 1 : i + 1 + block].astype(np.int64)) for i in starts]
        )
        _, loss = gpt(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    lm = Training("nanogpt-cpu", "fp32", False, torch.device("cpu"))
    nano: list[float] = []
    for step in range(args.warmup + args.iters):
        timed = step >= args.warmup
        if step % 2:
            lm.step(step, timed)
        took = nanogpt_step()
        if step % 2 == 0:
            lm.step(step, timed)
        if timed:
            nano.append(took)
    ratios = sorted(n / m for n, m in zip(nano, lm.step_times, strict=True))
    q1, q3 = (ratios[int(f * (len(ratios) - 1))] for f in (0.25, 0.75))
    print(f"| program | median ms/step ({args.iters} steps each, in turn, one process) |")
    print("|---|---:|")
    print(f"| nanoGPT | {statistics.median(nano) * 1e3:.2f} |")
    print(f"| lm | {statistics.median(lm.step_times) * 1e3:.2f} |")
    print(
        f"\nlm / nanoGPT tokens/s, step by step: {statistics.median(ratios):.3f} "
        f"(quartiles {q1:.3f}-{q3:.3f})"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, required=True)
    parser.add_argument("--nanogpt-python", default=sys.executable)
    parser.add_argument("--data", required=True, help="Tiny Shakespeare input.txt")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30, help="steps dropped as warm-up")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="also run both compiled")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="the two training steps in turn in this process (--iters steps each), not whole runs",
    )
    args = parser.parse_args()
    if args.in_process:
        return in_process(args)

    programs = {"nanoGPT": (nanogpt_steps, False), "lm": (lm_steps, False)}
    if args.compile:
        programs["nanoGPT compiled"] = (nanogpt_steps, True)
        programs["lm compiled"] = (lm_steps, True)
    names = list(programs)
    step_s: dict[str, list[float]] = {name: [] for name in names}  # one median per repeat
    wall_s: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                steps, compiled = programs[name]
                t0 = time.perf_counter()
                times = steps(args, compiled, Path(tmp) / f"r{i}")
                wall_s[name].append(time.perf_counter() - t0)
                step_s[name].append(statistics.median(times))
            print(
                f"repeat {i + 1}: "
                + ", ".join(f"{n} {step_s[n][-1] * 1e3:.2f} ms/step" for n in names),
                file=sys.stderr,
                flush=True,
            )

    print(f"| program | median ms/step | tokens/s | wall s for {args.iters} steps |")
    print("|---|---:|---:|---:|")
    for name in names:
        ms = statistics.median(step_s[name])
        wall = statistics.median(wall_s[name])
        print(f"| {name} | {ms * 1e3:.2f} | {TOKENS_PER_STEP / ms:,.0f} | {wall:.1f} |")
    pairs = [("lm", "nanoGPT")]
    if args.compile:
        pairs += [("lm compiled", "nanoGPT"), ("lm compiled", "nanoGPT compiled")]
    print()
    for a, b in pairs:
        ratios = [y / x for x, y in zip(step_s[a], step_s[b], strict=True)]
        print(
            f"{a} / {b} tokens/s: {statistics.median(ratios):.2f} (median of {len(ratios)} "
            "repeats: " + ", ".join(f"{r:.2f}" for r in ratios) + ")"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
