"""Make the references ``lm bench`` compares a scheme against: every builtin scheme through the
battery (``lm/benchmark/battery.py``), its scores' per-seed values, mean and std and its length
curve written into ``lm/benchmark/references.json``, and a row of ``lm/benchmark/RUN.md``
saying where, when, at which commit and in what wall time it ran.

    python scripts/bench_references.py --quick          # every builtin, the quick battery
    python scripts/bench_references.py                  # every builtin, the full battery
    python scripts/bench_references.py rope p-rope      # the named ones
    python scripts/bench_references.py --jobs auto      # each scheme's runs side by side
    python scripts/bench_references.py --table          # the full references as a table

Resumable per scheme: a scheme whose reference for this battery is there (made with the same
battery settings) is skipped, its runs under ``runs/bench-references/`` are reused by the next
run (finished runs are, as ``lm bench`` reuses them), and the JSON is written after each scheme.
Run it from the repository root, alone on the machine where its wall times are to mean
anything (RUN.md says whether it was).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lm.benchmark.battery import BUILTINS, SEEDS, benchmarks, scores
from lm.benchmark.card import REFERENCES, battery_settings, read_references
from lm.benchmark.run import plan, run_battery, summary
from lm.config.errors import LMError
from lm.runtime.choices import OtherWork

ROOT = Path(__file__).resolve().parent.parent
RECORD = REFERENCES.with_name("RUN.md")
OUT = ROOT / "runs" / "bench-references"


def machine() -> str:
    """The CPU's model (lscpu's) and its bf16 kind: AMX, AVX-512 BF16, or none (emulated)."""
    name, flags = "unknown CPU", ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            name = value.strip()
        elif key.strip() == "flags":
            flags = f" {value} "
    kind = "AMX" if " amx_bf16 " in flags else "AVX-512 BF16" if " avx512_bf16 " in flags else ""
    return f"{name}, bf16: {kind or 'no native bf16'}"


def commit() -> str:
    """The commit, with ``+`` when lm/ or configs/ had changes."""

    def git(*words: str) -> str:
        done = subprocess.run(["git", *words], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    ours = (":!lm/benchmark/references.json", ":!lm/benchmark/RUN.md")  # what the script writes
    dirty = git("status", "--porcelain", "--", "lm", "configs", *ours)
    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+" if dirty else "")


def record(battery: str, scheme: str, seconds: float, at: str, beside: str) -> None:
    """Writes (or replaces) the scheme's row of RUN.md for this battery."""
    minutes, rest = divmod(round(seconds), 60)
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    row = (
        f"| {battery} | {scheme} | {day} | {machine()} | {at} | {minutes} min {rest} s | {beside} |"
    )
    lines = RECORD.read_text(encoding="utf-8").splitlines()
    key = f"| {battery} | {scheme} |"
    kept = [line for line in lines if not line.startswith(key)]
    rows = [line for line in kept if line.startswith("| ") and not line.startswith("| battery")]
    head = [line for line in kept if line not in rows]
    order = {s: i for i, s in enumerate(BUILTINS)}
    rows = sorted([*rows, row], key=lambda r: (r.split("|")[1], order.get(r.split("|")[2].strip())))
    RECORD.write_text("\n".join(head + rows) + "\n", encoding="utf-8")


def _made(battery: str, references: dict | None = None) -> dict:
    """The battery's references (in ``references``, default the file's), emptied when they were
    made with other battery settings: none of them is this battery's."""
    references = read_references() if references is None else references
    made = references["batteries"].setdefault(battery, {})
    if made.get("settings") != battery_settings(battery):
        made.clear()
        made.update(settings=battery_settings(battery), seeds=list(SEEDS[battery]), schemes={})
    return made


def table(battery: str) -> str:
    """The battery's references as a Markdown table, a row per builtin made (in the card's
    order of schemes) and a column per score: mean ± std over the seeds, the best in bold."""
    made = _made(battery)["schemes"]
    ids = [s.id(b) for b in benchmarks(battery) for s in b.scores]
    shown, best = scores(), {}
    for key in ids:
        means = [m["scores"][key]["mean"] for m in made.values()]
        means = [m for m in means if m is not None]
        best[key] = (max if shown[key].higher_is_better else min)(means, default=None)
    lines = [
        "| scheme | " + " | ".join(ids) + " |",
        "|---|" + "---:|" * len(ids),
    ]
    for scheme in (s for s in BUILTINS if s in made):
        cells = []
        for key in ids:
            got = made[scheme]["scores"][key]
            text = shown[key].text(got["mean"])
            if got["mean"] is not None and got.get("std") is not None:
                text += f" ± {shown[key].text(got['std'])}"
            cells.append(f"**{text}**" if got["mean"] == best[key] is not None else text)
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "schemes", nargs="*", help="builtin schemes, p-rope among them (default: every one)"
    )
    parser.add_argument("--quick", action="store_true", help="the quick battery (1 seed)")
    parser.add_argument("--again", action="store_true", help="remake references already there")
    parser.add_argument(
        "--table", action="store_true", help="print the references made as a table; train none"
    )
    parser.add_argument(
        "--jobs",
        default="1",
        help="each scheme's runs trained at once, as lm bench --jobs (default 1; auto: decided "
        "on the length curve's shape); the numbers do not depend on it",
    )
    args = parser.parse_args()
    if args.jobs != "auto" and not (args.jobs.isdigit() and int(args.jobs) > 0):
        said = f"bench_references: --jobs {args.jobs}: a whole number above 0, or auto"
        print(said, file=sys.stderr)
        return 2
    jobs = args.jobs if args.jobs == "auto" else int(args.jobs)
    battery = "quick" if args.quick else "full"
    if args.table:
        print(table(battery))
        return 0
    unknown = [s for s in args.schemes if s not in BUILTINS]
    if unknown:
        print(f"bench_references: not builtin schemes: {', '.join(unknown)}", file=sys.stderr)
        return 2
    for scheme in args.schemes or list(BUILTINS):
        if scheme in _made(battery)["schemes"] and not args.again:
            print(f"bench_references: {battery} {scheme}: there; --again remakes it", flush=True)
            continue
        at, start, watch = commit(), time.perf_counter(), OtherWork()
        position, settings = BUILTINS[scheme]
        planned = plan(position, list(settings), battery, OUT / battery / scheme)
        made = {**summary(run_battery(planned, battery, jobs=jobs)), "machine": machine()}
        # Read again just before writing: another run of the script may have added its own.
        references = read_references()
        _made(battery, references)["schemes"][scheme] = made
        kept = REFERENCES.with_name(f".{REFERENCES.name}.{os.getpid()}")  # replaced whole
        kept.write_text(json.dumps(references, indent=1) + "\n", encoding="utf-8")
        os.replace(kept, REFERENCES)
        seconds = time.perf_counter() - start
        record(battery, scheme, seconds, at, watch.said())
        print(f"bench_references: {battery} {scheme}: {seconds / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:  # what was saved; the same command resumes
        sys.exit(f"bench_references: interrupted; {e}")
    except LMError as e:
        sys.exit(f"bench_references: {e}")
