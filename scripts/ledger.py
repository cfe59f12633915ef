"""Rerun the experiments behind docs/claims.md, one after another, each as its page writes it,
and put what they wrote into docs/: each experiment's report (``report.md``, ``report.json``,
the pictures) into its folder, the tables its pages quote refreshed (scripts/docs_tables.py),
and a row of docs/claims/RUN.md saying where, when, at which commit and in what wall time it
ran.

    python scripts/ledger.py --list [NAME ...]   # the experiments, their rows and commands
    python scripts/ledger.py                     # every experiment (about 3.5 hours on 2 cores)
    python scripts/ledger.py counting mqar       # the named ones

Run it from the repository root with ``lm`` installed, alone on the machine: the wall times go
into docs/claims/RUN.md, each beside how much other work the machine ran meanwhile (watched as
``lm``'s measurements are: every CPU's busy time from ``/proc/stat`` less the ledger's own and
its commands'), ``alone`` where that averaged at most ``BUSY`` CPUs, else ``beside other
work``: a wall time taken beside other work is slower than the experiment. An experiment writes
its runs under ``runs/`` as its page says; one whose folder is already there is refused before
anything runs (move it away to rerun it), so a rerun never mixes old runs into a new report.
The verdicts in the pages are prose: read the new tables against them (``git diff docs/``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lm.runtime.choices import BUSY_SLACK, OtherWork

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RECORD = DOCS / "claims" / "RUN.md"
EXTRAPOLATION = (
    "lm compare configs/extrapolation.yaml --seeds 1,2,3 --eval-lengths 1x,1.5x,2x,3x,4x,8x"
)
LLAMA = (
    "model.norm=rmsnorm model.mlp=swiglu model.n_kv_head=2 model.bias=false "
    "model.tie_embeddings=false"
)
EVERY_SCHEME = (
    "rope,alibi,sinusoidal,learned,none,sandwich,xpos,fox,cope,rope+model.rope_p=0.25,"
    "rope+model.normalize=ssmax,none+model.normalize=stick_breaking,rope+model.window=16"
)
ADDITION = "lm compare configs/addition_hints.yaml --seeds 1,2,3 --jobs auto"
ADDITION_BUDGET = (
    "data.task_lengths=1-5 data.task_eval_lengths=1-12 model.n_layer=4 model.d_model=128 "
    "train.max_steps=6000 train.lr=1e-3"
)
FLIPFLOP = "lm compare configs/flipflop.yaml --seeds 1,2,3 --jobs auto"
FLIPFLOP_SCHEMES = "rope,learned,alibi,cope,fox,none,none+model.normalize=stick_breaking"
INDUCTION = (
    "lm compare configs/induction.yaml --seeds 1,2,3 --jobs auto --eval-lengths 1x "
    "--eval-batches 8 --prompt KdqWzbRmKdqW --max-new-tokens 8"
)
INDUCTION_SCHEMES = "rope,sinusoidal,learned,alibi,none"
CONTEXTS = ",".join(f"{T}+data.task_lengths={T // 2}" for T in (16, 32, 64, 96))
"""Contexts of the formation-against-context runs, each row one sequence of half of it written
twice (the probe's shape; 96 holds 48 letters, the probe's at most 52)."""
ONE_SEQUENCE = (
    "data.mode=padded data.repeats_distinct=false train.max_steps=1000 train.eval_every=10"
)
"""One sequence per row, its letters drawn with replacement, evaluated every 10 steps."""
INDUCTION_SCHEMES_2 = "t5,fire,fox"
"""The schemes of the second and third experiments, sized by 200 steps of one seed on one core of
the AMD EPYC, the other running other work (T5 5.1 s, FIRE 9.6, FoX 9.4, CoPE 14.4, PoPE 10.6,
RoPE 3.2): each took under 9 minutes on one core (docs/claims/RUN.md)."""
INDUCTION_SCHEMES_3 = "cope,pope"
INDUCTION_SCHEMES_4 = "kerple,sandwich,xpos,fope,hope,rope+model.rope_p=0.25"
"""Measured as the others (200 steps, one core): KERPLE 5.2 s, Sandwich 3.3, xPos 3.1, FoPE 2.9,
HoPE 3.1, against DAPE's 16.1 and PaTH's 14.7, which make the fifth and sixth."""
INDUCTION_SCHEMES_5 = "dape"
"""DAPE and PaTH, the slowest (a seed 3.4 and 3.9 minutes on one core), each an experiment of its
own: together they took 22 minutes on one core beside other work, over the 15."""
INDUCTION_SCHEMES_6 = "path"
INDUCTION_RUNS = " ".join(
    f"runs/induction-{name}"
    for name in ("schemes", "stick-breaking", *(f"schemes-{n}" for n in range(2, 7)))
)
INDUCTION_PANELS = {
    "no positions, or positions added to the embeddings": "rope,none,learned,sinusoidal",
    "queries and keys rotated": "rope,xpos,rope+rope_p=0.25,hope,fope,pope",
    "a bias by distance": "rope,alibi,t5,kerple,sandwich,fire,dape",
    "position from content": "rope,fox,cope,path,none+normalize=stick_breaking",
}
"""The picture of every scheme measured, a panel per family, RoPE drawn in each for reference."""
PASSKEY_REPORT = "--eval-lengths 1x --eval-batches 4"
"""The passkey sweeps' loss at the trained length only (their grid is the measure), on 4
batches."""
PASSKEY_STEPS = (200, 400, 800)
"""Fine-tuning steps of the passkey extensions, each a fine-tune of its own (its own schedule):
PI's answer loss, on lengths 64 to 128, is 0.71 at step 200, 0.13 at 500 and 0.03 by 700 (seed
1, docs/tasks.md)."""
PASSKEY_EXTENSIONS = ",".join(
    f"{scaling}+train.max_steps={steps}"
    for scaling in ("pi:2", "yarn:2", "none")
    for steps in PASSKEY_STEPS
)


@dataclass(frozen=True)
class Experiment:
    name: str
    folder: str
    """Where under docs/ its report goes."""
    rows: str
    """The rows of docs/claims.md it checks."""
    commands: tuple[str, ...]
    """Shell words, run in order from the repository root; ``lm`` is this interpreter's."""
    report: str = ""
    """The runs folder whose report is kept (default: the last command's ``--out``; ``-``: none,
    for a script that writes its own table into docs/)."""


EXPERIMENTS = (
    Experiment(
        "schemes",
        "extrapolation",
        "1-7, 17",
        (
            f"{EXTRAPOLATION} --vary model.position={EVERY_SCHEME} --set train.batch_size=16 "
            "--jobs auto --out runs/schemes",
        ),
    ),
    Experiment(
        "ssmax-nope",
        "extrapolation/ssmax-nope",
        "6",
        (
            f"{EXTRAPOLATION} --vary model.position=none,none+model.normalize=ssmax "
            "--set train.batch_size=16 --jobs auto --out runs/ssmax-nope",
        ),
    ),
    Experiment(
        "fading",
        "extrapolation/fading",
        "6",
        (
            "lm compare configs/extrapolation.yaml --vary model.position=rope,"
            "rope+model.normalize=ssmax,none,none+model.normalize=ssmax --set "
            "train.batch_size=16 --seeds 1,2,3 --eval-lengths 1x,8x --jobs auto --out runs/fading",
            "python scripts/attention_fading.py runs/fading "
            "--table docs/extrapolation/fading/fading.md",
        ),
        report="runs/fading",
    ),
    Experiment(
        "extensions",
        "extrapolation/extensions",
        "12-14",
        (
            f"{EXTRAPOLATION} --vary model.position=rope,alibi,sinusoidal,learned,none "
            "--vary eval.rope_scaling=none,pi:4,ntk:4,yarn:4 --jobs auto --out runs/extrapolation",
        ),
    ),
    Experiment(
        "fine-tuning",
        "extrapolation/extensions",
        "15-16",
        (
            "python scripts/extend_context.py --runs runs/extrapolation --out runs/extend "
            "--table docs/extrapolation/extensions/fine-tuning.md",
        ),
        report="-",
    ),
    Experiment(
        "fine-tuning-1000",
        "extrapolation/extensions",
        "16",
        (
            "python scripts/extend_context.py --runs runs/extrapolation --out runs/extend-1000 "
            "--steps 1000 --table docs/extrapolation/extensions/fine-tuning-1000.md",
        ),
        report="-",
    ),
    Experiment(
        "llama",
        "extrapolation/llama",
        "6",
        (
            f"{EXTRAPOLATION} --vary model.position={EVERY_SCHEME} "
            f"--set train.batch_size=16 {LLAMA} --jobs auto --out runs/llama-schemes",
        ),
    ),
    Experiment(
        "rethought",
        "extrapolation/rethought",
        "8, 9, 11",
        (
            f"{EXTRAPOLATION} --vary model.position=pope,fope,hope,dape,path "
            "--set train.batch_size=16 --jobs auto --out runs/new-schemes",
            f"{EXTRAPOLATION} --vary model.position=kerple,dape+model.dape_bias=alibi "
            "--set train.batch_size=16 --jobs auto --out runs/dape-controls",
            "lm compare runs/new-schemes runs/dape-controls --eval-lengths 1x,1.5x,2x,3x,4x,8x "
            "--out runs/rethought",
        ),
    ),
    Experiment(
        "base40",
        "extrapolation/base40",
        "9, 10",
        (
            f"{EXTRAPOLATION} --vary model.position=rope,fope,hope "
            "--set train.batch_size=16 model.rope_base=40 --jobs auto --out runs/base40",
        ),
    ),
    Experiment(
        "copy",
        "lengthgen",
        "22-24",
        (
            "lm compare configs/copy.yaml --vary model.position=rope,alibi,none,t5,kerple,fire "
            "--seeds 1,2,3 --jobs auto --out runs/copy",
            "lm compare configs/copy.yaml --vary model.position=rope,alibi,t5,kerple,fire "
            "--set model.random_positions=64 --seeds 1,2,3 --jobs auto --out runs/copy-random",
            "lm compare runs/copy runs/copy-random --out runs/lengthgen",
        ),
    ),
    Experiment(
        "flipflop",
        "lengthgen/flipflop",
        "18-20, 23",
        (
            "lm compare configs/flipflop.yaml --seeds 1,2,3 --jobs auto "
            f"--vary model.position={FLIPFLOP_SCHEMES} --out runs/flipflop",
        ),
    ),
    Experiment(
        "flipflop-llama",
        "lengthgen/flipflop-llama",
        "18-20",
        (
            f"{FLIPFLOP} --vary model.position={FLIPFLOP_SCHEMES} --set {LLAMA} "
            "--out runs/flipflop-llama",
        ),
    ),
    Experiment(
        "flipflop-nope-parts",
        "lengthgen/flipflop-nope-parts",
        "23",
        (
            f"{FLIPFLOP} --vary model.position=none+model.norm=rmsnorm,none+model.mlp=swiglu,"
            "none+model.n_kv_head=2,none+model.tie_embeddings=false --out runs/flipflop-nope-parts",
        ),
    ),
    Experiment(
        "flipflop-rethought",
        "lengthgen/flipflop-rethought",
        "21",
        (f"{FLIPFLOP} --vary model.position=pope,fope,hope,dape,path --out runs/flipflop-new",),
    ),
    Experiment(
        "flipflop-path-more",
        "lengthgen/flipflop-path-more",
        "21",
        (
            "lm compare configs/flipflop.yaml --vary model.position=path --seeds 4,5,6 --jobs auto "
            "--out runs/flipflop-path-more",
        ),
    ),
    Experiment(
        "flipflop-cope-budget",
        "lengthgen/flipflop-cope-budget",
        "20",
        (
            f"{FLIPFLOP} --vary model.position=cope+model.tie_embeddings=false,"
            "cope+train.max_steps=3000 --out runs/flipflop-cope-budget",
        ),
    ),
    Experiment(
        "indexing-pope",
        "tasks/indexing-pope",
        "25",
        (
            "lm compare configs/indexing.yaml --vary model.position=rope,pope --seeds 1,2,3 "
            "--jobs auto --out runs/indexing-pope",
        ),
    ),
    Experiment(
        "indexing-pope-big",
        "tasks/indexing-pope-big",
        "25",
        (
            "lm compare configs/indexing.yaml --vary model.position=rope,pope --seeds 1,2,3 "
            "--set model.n_layer=4 model.d_model=128 train.max_steps=5000 --jobs auto "
            "--out runs/indexing-pope-big",
        ),
    ),
    Experiment(
        "selective-copy",
        "tasks/selective-copy",
        "26, 27",
        (
            "lm compare configs/selective_copy.yaml --vary model.position=rope,learned,cope,none "
            "--seeds 1,2,3 --jobs auto --out runs/selective-copy",
        ),
    ),
    Experiment(
        "counting",
        "tasks/counting",
        "28, 29",
        (
            "lm compare configs/counting.yaml --vary model.position=rope,learned,cope,none "
            "--seeds 1,2,3 --jobs auto --out runs/counting",
        ),
    ),
    Experiment(
        "mqar",
        "tasks/mqar",
        "30, 31",
        (
            "lm compare configs/mqar.yaml --vary model.window=null,48,16 --seeds 1,2,3 "
            "--jobs auto --out runs/mqar",
        ),
    ),
    Experiment(
        "counting-steps",
        "tasks/counting-steps",
        "28, 29",
        (
            "lm compare configs/counting.yaml --vary model.position=cope+train.max_steps=250,"
            "cope+train.max_steps=500,cope+train.max_steps=1000,none+train.max_steps=250,"
            "none+train.max_steps=500,none+train.max_steps=1000 --seeds 1,2,3 --jobs auto "
            "--out runs/counting-steps",
        ),
    ),
    Experiment(
        "counting-size",
        "tasks/counting-size",
        "28, 29",
        (
            "lm compare configs/counting.yaml --vary model.position=cope+model.d_model=32,"
            "cope+model.n_layer=1,none+model.d_model=32,none+model.n_layer=1 --seeds 1,2,3 "
            "--jobs auto --out runs/counting-size",
        ),
    ),
    Experiment(
        "addition",
        "tasks/addition",
        "32",
        (
            f"{ADDITION} --vary data.addition_reversed=true,false --set data.addition_hints=false "
            f"{ADDITION_BUDGET} --out runs/addition",
        ),
    ),
    Experiment(
        "addition-hints",
        "tasks/addition-hints",
        "33",
        (
            f"{ADDITION} --vary data.addition_hints=true --set data.addition_reversed=true "
            f"{ADDITION_BUDGET} --out runs/addition-hints",
        ),
    ),
    Experiment(
        "copy-random-eval",
        "lengthgen/copy-random-eval",
        "24",
        (
            "lm compare configs/copy.yaml --vary model.position=rope,fire,"
            "rope+model.random_positions=64+model.random_positions_eval=true,"
            "fire+model.random_positions=64+model.random_positions_eval=true "
            "--set train.max_steps=6000 train.lr=1e-3 --seeds 1,2,3 --jobs auto "
            "--out runs/copy-random-eval",
        ),
    ),
    Experiment(
        "parity",
        "tasks/parity",
        "34-36",
        (
            "lm compare configs/parity.yaml --vary model.position=rope,learned,none,"
            "rope+model.random_positions=64,"
            "rope+model.random_positions=64+model.random_positions_eval=true,"
            "learned+model.random_positions=64+model.random_positions_eval=true "
            "--seeds 1,2,3 --jobs auto --out runs/parity",
        ),
    ),
    Experiment(
        "induction-olsson",
        "heads/olsson",
        "37-39",
        (
            f"{INDUCTION} --set data.repeats_distinct=false --vary model.n_layer=2,1,"
            "1+model.smear_keys=true,1+model.smear_keys=true+data.repeats_distinct=true "
            "--out runs/induction-olsson",
            "python scripts/induction.py runs/induction-olsson "
            "--table docs/heads/olsson/formation.md "
            "--picture docs/heads/olsson/induction_vs_step.png",
        ),
    ),
    Experiment(
        "induction-context",
        "heads/context",
        "40",
        (
            f"{INDUCTION} --set {ONE_SEQUENCE} --vary model.context_length={CONTEXTS} "
            "--out runs/induction-context",
            "python scripts/induction.py runs/induction-context "
            "--table docs/heads/context/formation.md "
            "--picture docs/heads/context/induction_vs_step.png",
            "python scripts/induction.py runs/induction-context --fit model.context_length "
            "--table docs/heads/context/fit.md",
        ),
    ),
    Experiment(
        "induction-schemes",
        "heads/schemes",
        "41-43",
        (
            f"{INDUCTION} --vary model.position={INDUCTION_SCHEMES} --out runs/induction-schemes",
            "python scripts/induction.py runs/induction-schemes "
            "--table docs/heads/schemes/formation.md "
            "--picture docs/heads/schemes/induction_vs_step.png",
        ),
    ),
    Experiment(
        "induction-stick-breaking",
        "heads/stick-breaking",
        "44",
        (
            f"{INDUCTION} --vary model.position=none+model.normalize=stick_breaking "
            "--out runs/induction-stick-breaking",
            "python scripts/induction.py runs/induction-schemes runs/induction-stick-breaking "
            "--table docs/heads/schemes/formation.md "
            "--picture docs/heads/schemes/induction_vs_step.png",
        ),
    ),
    Experiment(
        "induction-schemes-2",
        "heads/schemes-2",
        "44, 53, 54",
        (
            f"{INDUCTION} --vary model.position={INDUCTION_SCHEMES_2} "
            "--out runs/induction-schemes-2",
            "python scripts/induction.py runs/induction-schemes-2 "
            "--table docs/heads/schemes-2/formation.md",
        ),
    ),
    Experiment(
        "induction-schemes-3",
        "heads/schemes-3",
        "44, 55",
        (
            f"{INDUCTION} --vary model.position={INDUCTION_SCHEMES_3} "
            "--out runs/induction-schemes-3",
            "python scripts/induction.py runs/induction-schemes-3 "
            "--table docs/heads/schemes-3/formation.md",
        ),
    ),
    Experiment(
        "induction-schemes-4",
        "heads/schemes-4",
        "53, 56, 57",
        (
            f"{INDUCTION} --vary model.position={INDUCTION_SCHEMES_4} "
            "--out runs/induction-schemes-4",
            "python scripts/induction.py runs/induction-schemes-4 "
            "--table docs/heads/schemes-4/formation.md",
        ),
    ),
    Experiment(
        "induction-schemes-5",
        "heads/schemes-5",
        "58",
        (
            f"{INDUCTION} --vary model.position={INDUCTION_SCHEMES_5} "
            "--out runs/induction-schemes-5",
            "python scripts/induction.py runs/induction-schemes-5 "
            "--table docs/heads/schemes-5/formation.md",
        ),
    ),
    Experiment(
        "induction-schemes-6",
        "heads/schemes-6",
        "44",
        (
            f"{INDUCTION} --vary model.position={INDUCTION_SCHEMES_6} "
            "--out runs/induction-schemes-6",
            "python scripts/induction.py runs/induction-schemes-6 "
            "--table docs/heads/schemes-6/formation.md",
        ),
    ),
    Experiment(
        "induction-schemes-all",
        "heads/schemes",
        "41-44, 53-58",
        (
            f"python scripts/induction.py {INDUCTION_RUNS} "
            "--table docs/heads/schemes/formation.md "
            "--picture docs/heads/schemes/induction_vs_step.png "
            + " ".join(
                f"--panel '{title}=" + ",".join(f"position={g}" for g in groups.split(",")) + "'"
                for title, groups in INDUCTION_PANELS.items()
            ),
        ),
        report="-",
    ),
    Experiment(
        "passkey-rope",
        "tasks/passkey-rope",
        "48",
        (
            "lm compare configs/passkey_base.yaml --vary model.position=rope --seeds 1,2,3 "
            f"{PASSKEY_REPORT} --jobs auto --out runs/passkey-rope",
        ),
    ),
    Experiment(
        "passkey-extend",
        "tasks/passkey-extend",
        "45-47",
        (
            "lm compare configs/passkey_extend.yaml --init-from runs/passkey-rope/position=rope "
            f"--vary model.rope_scaling={PASSKEY_EXTENSIONS} --seeds 1,2,3 {PASSKEY_REPORT} "
            "--jobs auto --out runs/passkey-extend",
        ),
    ),
    Experiment(
        "passkey-fire",
        "tasks/passkey-fire",
        "52",
        (
            "lm compare configs/passkey_base.yaml --vary model.position=fire "
            f"--seeds 1,2,3 {PASSKEY_REPORT} --jobs auto --out runs/passkey-fire",
        ),
    ),
    Experiment(
        "passkey-schemes",
        "tasks/passkey-schemes",
        "49-51",
        (
            "lm compare configs/passkey_base.yaml --vary model.position=alibi,none "
            f"--seeds 1,2,3 {PASSKEY_REPORT} --jobs auto --out runs/passkey-others",
            f"lm compare runs/passkey-rope runs/passkey-others runs/passkey-fire {PASSKEY_REPORT} "
            "--out runs/passkey-schemes",
        ),
    ),
)
BY_NAME = {e.name: e for e in EXPERIMENTS}


def argv(command: str) -> list[str]:
    """A command's words, with ``lm`` and ``python`` as this interpreter."""
    words = shlex.split(command)
    if words[0] == "lm":
        return [sys.executable, "-m", "lm", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return words


def outs(experiment: Experiment) -> list[Path]:
    """The folders its commands write (each ``--out``)."""
    found = []
    for command in experiment.commands:
        words = shlex.split(command)
        if "--out" in words:
            found.append(ROOT / words[words.index("--out") + 1])
    return found


def machine() -> str:
    """The CPU in a few words, as the pages name it: model, the vector units that rank dtypes and
    kernels differently (AVX-512, AMX), and the cores this process may use."""
    name, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = value
    except OSError:
        pass
    units = [u for u, f in (("AVX-512", " avx512f"), ("AMX", " amx_tile")) if f in flags]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    shown = f"{name} ({', '.join(units)})" if units else name
    return f"{shown}, {cores} cores"


def commit() -> str:
    """The commit it ran at, with ``+`` when the tree had changes."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "lm", "configs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return (head or "unknown") + ("+" if dirty else "")


BUSY = BUSY_SLACK
"""CPUs' worth of other work, on average over an experiment, above which its row says it ran
beside other work: as for lm's own measurements, a quiet machine's housekeeping stays well
under it and a second program does not. The load average would count the ledger's own runs."""


def run(experiment: Experiment) -> tuple[float, str, str]:
    """Runs its commands and keeps its report; returns the wall seconds, the commit they ran
    at and what other work ran beside them (:func:`other_work`). Stops the script if a command
    fails."""
    at, start, watch = commit(), time.perf_counter(), OtherWork()
    for command in experiment.commands:
        print(f"ledger: {experiment.name}: {command}", flush=True)
        done = subprocess.run(argv(command), cwd=ROOT)
        if done.returncode:
            sys.exit(f"ledger: {experiment.name}: `{command}` failed (exit {done.returncode})")
    seconds, beside = time.perf_counter() - start, watch.said()
    if experiment.report != "-":
        folder = DOCS / experiment.folder
        folder.mkdir(parents=True, exist_ok=True)
        source = ROOT / experiment.report if experiment.report else outs(experiment)[-1]
        for kept in [source / "report.md", source / "report.json", *source.glob("*.png")]:
            shutil.copy2(kept, folder / kept.name)
        describe(experiment)
    return seconds, at, beside


def describe(experiment: Experiment) -> None:
    """Writes its folder's RUN.md where there is none (a hand-written one, with notes on a run,
    is kept): its commands, and where to read where and when they last ran."""
    path = DOCS / experiment.folder / "RUN.md"
    if path.exists():
        return
    commands = "\n".join(experiment.commands)
    path.write_text(
        "# How these files were made\n\n"
        f"By `python scripts/ledger.py {experiment.name}` (claims rows {experiment.rows}), which "
        "ran, from the repository root,\n\n"
        f"```bash\n{commands}\n```\n\n"
        "and copied the report of its runs here unchanged. Where, when, at which commit and in "
        "what wall time it last ran: [`claims/RUN.md`]("
        + "../"
        * experiment.folder.count("/")
        + "../claims/RUN.md). The run folders named in the report are under `runs/`, which is "
        "not kept in the repository.\n",
        encoding="utf-8",
    )


def record(experiment: Experiment, seconds: float, at: str, beside: str) -> None:
    """Writes (or replaces) its row of docs/claims/RUN.md."""
    minutes, rest = divmod(round(seconds), 60)
    folder, day = experiment.folder, datetime.date.today().isoformat()
    row = (
        f"| {experiment.name} | {experiment.rows} | [{folder}](../{folder}/) | {day} "
        f"| {machine()} | {at} | {minutes} min {rest} s | {beside} |"
    )
    lines = RECORD.read_text(encoding="utf-8").splitlines() if RECORD.exists() else []
    if not lines:
        lines = [
            "# Where and when the ledger's experiments last ran",
            "",
            "Written by `python scripts/ledger.py` (the commands are in the script and on each",
            "experiment's page); each row is replaced when its experiment runs again, so the",
            "history is git's. Wall time is the whole experiment; beside it, what other work",
            f"the machine ran meanwhile (`alone`: at most {BUSY} CPUs of it on average).",
            "",
            "| experiment | claims rows | report | date | machine | commit | wall time "
            "| other work |",
            "|---|---|---|---|---|---|---|---|",
        ]
    key = f"| {experiment.name} |"
    kept = [line for line in lines if not line.startswith(key)]
    rule = next(i for i, line in enumerate(kept) if line.startswith("|---"))  # under the header
    order = {e.name: i for i, e in enumerate(EXPERIMENTS)}
    rows = [line for line in kept[rule + 1 :] if line.startswith("| ")] + [row]
    rows.sort(key=lambda line: order.get(line.split("|")[1].strip(), len(order)))
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text("\n".join(kept[: rule + 1] + rows) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="experiments to run (default: every one)")
    parser.add_argument(
        "--list", action="store_true", help="list the experiments (the named ones) and stop"
    )
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        print(f"ledger: no experiment {', '.join(unknown)} (--list names them)", file=sys.stderr)
        return 2
    chosen = [BY_NAME[n] for n in args.names] or list(EXPERIMENTS)
    if args.list:
        for e in chosen:
            print(f"{e.name}  (rows {e.rows}; docs/{e.folder})")
            for command in e.commands:
                print(f"    {command}")
        return 0
    there = [str(p.relative_to(ROOT)) for e in chosen for p in outs(e) if p.exists()]
    if there:
        print(
            f"ledger: {', '.join(there)} already there: move it away first, so that a new "
            "report holds only new runs",
            file=sys.stderr,
        )
        return 2
    for experiment in chosen:
        seconds, at, beside = run(experiment)
        record(experiment, seconds, at, beside)
        print(f"ledger: {experiment.name} took {seconds / 60:.1f} min", flush=True)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_tables.py")], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
