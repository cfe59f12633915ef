"""When induction heads form in trained runs, read from the head scores each evaluation logged
(``metrics.jsonl``; docs/heads.md), and whether the loss and the in-context learning score move
with them, as Olsson et al. 2022 ("In-context Learning and Induction Heads", arXiv 2209.11895)
found; with ``--fit``, how the formation step grows with a setting (Musat et al. 2025, "On the
Emergence of Induction Heads for In-Context Learning", arXiv 2511.01033: with the square of the
context length).

    python scripts/induction.py runs/induction-olsson --table docs/heads/olsson/formation.md
    python scripts/induction.py runs/induction-context --fit model.context_length \\
        --table docs/heads/context/formation.md
    python scripts/induction.py runs/induction-schemes --picture docs/heads/schemes/induction.png \\
        --panel "rotations=position=rope,position=xpos" --panel "biases=position=rope,..."

Per run, from its evaluations (every ``train.eval_every`` steps), with ``best`` the largest
induction score among all its layers' heads:

* **formation step**: the first evaluation at which ``best`` reaches ``--threshold`` (0.5: half
  of every second-copy query's weight on the token after its earlier copy, where a head that
  spreads evenly over a 64-token probe scores 0.02); none if it never does;
* **half-way steps** of the validation loss, the in-context learning score and ``best``: the
  first evaluation at which each has covered half of its change from the first evaluation to
  the last (a phase change moves all three at once);
* **rise**: steps from the first evaluation with ``best`` at 0.2 or more to the formation step;
* **lags**: the loss's and the icl score's half-way steps minus the formation step (0: together,
  within one evaluation interval).

A sweep's seeds of one setting make one row, mean ± std over the seeds that formed heads.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's lm
from lm.compare import plots
from lm.compare.sweep import find_runs
from lm.config.errors import LMError

THRESHOLD = 0.5
RISE_FROM = 0.2


def series(run: Path) -> dict[str, np.ndarray]:
    """A run's evaluations: ``step``, ``val_loss``, ``icl`` (NaN where none) and ``best``."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    evals = [r for r in rows if "heads" in r]
    if not evals:
        raise LMError(f"{run}: no evaluation logged head scores (train.head_scores, eval_every)")
    icl = [math.nan if r.get("icl_score") is None else r["icl_score"] for r in evals]
    return {
        "step": np.array([r["step"] for r in evals]),
        "val_loss": np.array([r["val_loss"] for r in evals], dtype=float),
        "icl": np.array(icl, dtype=float),
        "best": np.array([max(map(max, r["heads"]["induction"])) for r in evals]),
    }


def first_step(steps: np.ndarray, reached: np.ndarray) -> int | None:
    """The step of the first evaluation where ``reached`` holds, or None."""
    found = np.flatnonzero(reached)
    return int(steps[found[0]]) if len(found) else None


def half_way(steps: np.ndarray, values: np.ndarray) -> int | None:
    """The first evaluation at which ``values`` has covered half its change from the first to
    the last evaluation (either way), or None without two numbers."""
    kept = ~np.isnan(values)
    steps, values = steps[kept], values[kept]
    if len(values) < 2:
        return None
    middle = (values[0] + values[-1]) / 2
    return first_step(steps, values <= middle if values[-1] < values[0] else values >= middle)


def measure(run: Path, threshold: float) -> dict:
    s = series(run)
    formed = first_step(s["step"], s["best"] >= threshold)
    rise = first_step(s["step"], s["best"] >= RISE_FROM)
    loss_half, icl_half = half_way(s["step"], s["val_loss"]), half_way(s["step"], s["icl"])
    lag = lambda step: None if step is None or formed is None else step - formed  # noqa: E731
    return {
        "formed": formed,
        "loss_lag": lag(loss_half),
        "icl_lag": lag(icl_half),
        "rise": None if formed is None or rise is None else formed - rise,
        "loss_half": loss_half,
        "icl_half": icl_half,
        "best_half": half_way(s["step"], s["best"]),
        "loss": (float(s["val_loss"][0]), float(s["val_loss"][-1])),
        "icl": (float(s["icl"][0]), float(s["icl"][-1])),
        "peak": float(s["best"].max()),
        "last": float(s["best"][-1]),
        "curve": (s["step"].tolist(), s["best"].tolist()),
    }


def runs_in_order(paths: list[str]) -> list[Path]:
    """The runs ``paths`` name, a sweep's in the order it trained them (its sweep.json)."""
    found: list[Path] = []
    for path in map(Path, paths):
        sweep = path / "sweep.json"
        if sweep.is_file():
            found += [path / run for run in json.loads(sweep.read_text())["runs"]]
        else:
            found += find_runs([path])
    return found


def setting(run: Path, key: str) -> float:
    """A run's value of the dotted ``key`` in its config.yaml."""
    section, name = key.split(".", 1)
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    return float(config[section][name])


def cell(values: list, digits: int = 0, signed: bool = False) -> str:
    """Mean ± std of the numbers among ``values`` (None left out); ``—`` if none."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "—"
    sign = "+" if signed else ""
    text = f"{statistics.mean(values):{sign}.{digits}f}"
    return text + (f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else "")


def table(groups: dict[str, list[dict]], threshold: float) -> list[str]:
    lines = [
        f"| runs | seeds | formed | formation step (best ≥ {threshold:g}) | rise from "
        f"{RISE_FROM:g} (steps) | half-way step: val loss | icl score | best induction | "
        "val loss, icl score half-way minus formation (steps) | val loss first → last | "
        "icl score first → last | best induction: peak | last |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|",
    ]
    for name, found in groups.items():
        get = {key: [f[key] for f in found] for key in found[0]}
        formed = sum(f is not None for f in get["formed"])
        first, last = zip(*get["loss"], strict=True)
        icl_first, icl_last = zip(*get["icl"], strict=True)
        lines.append(
            f"| {name} | {len(found)} | {formed} of {len(found)} | {cell(get['formed'])} | "
            f"{cell(get['rise'])} | {cell(get['loss_half'])} | {cell(get['icl_half'])} | "
            f"{cell(get['best_half'])} | {cell(get['loss_lag'], signed=True)}, "
            f"{cell(get['icl_lag'], signed=True)} | {cell(list(first), 3)} → "
            f"{cell(list(last), 3)} | {cell(list(icl_first), 3, True)} → "
            f"{cell(list(icl_last), 3, True)} | "
            f"{cell(get['peak'], 3)} | {cell(get['last'], 3)} |"
        )
    return lines


def fit(groups: dict[str, list[dict]], values: dict[str, float], key: str) -> list[str]:
    """The exponent b of formation step ~ a * value^b: a least-squares line through log step
    against log value, for each seed that formed heads at every value, and through the means."""
    names = [n for n in groups if all(f["formed"] is not None for f in groups[n])]
    x = np.log([values[n] for n in names])
    lines = [f"Formation step against {key}: a line through log step against log {key}."]
    if len(names) < 2:
        return [*lines, "", f"Fewer than two values of {key} formed heads in every seed: no fit."]
    seeds = min(len(groups[n]) for n in names)
    slopes = [
        float(np.polyfit(x, np.log([groups[n][k]["formed"] for n in names]), 1)[0])
        for k in range(seeds)
    ]
    means = np.log([statistics.mean(f["formed"] for f in groups[n]) for n in names])
    shown = ", ".join(f"{values[n]:g}" for n in names)
    left = [n for n in groups if n not in names]
    return [
        *lines,
        "",
        f"- values fitted: {shown}" + (f" (left out, some seed formed none: {left})" * bool(left)),
        f"- exponent, each seed's own fit: {cell(slopes, 2)} (seeds: "
        + ", ".join(f"{b:.2f}" for b in slopes) + ")",
        f"- exponent of the means' fit: {float(np.polyfit(x, means, 1)[0]):.2f}",
    ]  # fmt: skip


def panels(specs: list[str], groups: list[str]) -> dict[str, list[str]] | None:
    """``--panel TITLE=GROUP,GROUP`` as {title: groups}; every group must be in one panel at
    least (a picture of "all the schemes" leaves none out), and each name a group."""
    if not specs:
        return None
    found: dict[str, list[str]] = {}
    for spec in specs:
        title, _, names = spec.partition("=")
        found[title] = [n.strip() for n in names.split(",") if n.strip()]
        unknown = [n for n in found[title] if n not in groups]
        if not title or not found[title] or unknown:
            raise LMError(
                f"--panel {spec!r}: want TITLE=GROUP,GROUP with groups among {', '.join(groups)}"
            )
    left = [g for g in groups if not any(g in names for names in found.values())]
    if left:
        raise LMError(f"--panel: {', '.join(left)} in no panel")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="runs, or folders of runs (a sweep's --out)")
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument("--fit", metavar="KEY", help="fit formation step ~ KEY^b (a config key)")
    parser.add_argument("--table", help="also write the tables to this file")
    parser.add_argument("--picture", help="draw the best induction score against step here")
    parser.add_argument(
        "--panel",
        action="append",
        metavar="TITLE=GROUP,...",
        help="with --picture, a panel of these groups (the table's rows); repeat for a grid",
    )
    args = parser.parse_args()
    try:
        groups: dict[str, list[dict]] = {}
        values: dict[str, float] = {}
        for run in runs_in_order(args.runs):  # a sweep's seeds of one setting are one row
            name = run.parent.name if run.name.startswith("seed") else str(run)
            groups.setdefault(name, []).append(measure(run, args.threshold))
            if args.fit:
                values[name] = setting(run, args.fit)
        grid = panels(args.panel or [], list(groups))
    except (LMError, OSError, KeyError, ValueError) as e:
        sys.exit(f"induction.py: {e}")
    lines = table(groups, args.threshold)
    if args.fit:
        lines += ["", *fit(groups, values, args.fit)]
    print("\n".join(lines))
    if args.table:
        Path(args.table).parent.mkdir(parents=True, exist_ok=True)
        Path(args.table).write_text("\n".join(lines) + "\n", encoding="utf-8")
    if args.picture:
        curves = {name: [f["curve"] for f in found] for name, found in groups.items()}
        plots.induction_vs_step(curves, args.threshold, args.picture, grid)


if __name__ == "__main__":
    main()
