"""The comparison report's passkey part (``lm.compare.report`` calls it): each run's k_max and
accuracy per length in a table, and its grid of lengths by depths as a heatmap, read from the
report's ``RunResult`` objects (their ``seed`` and ``accuracy``). The passkey test
and k_max are Position Interpolation's (Chen et al. 2023, arXiv 2306.15595, section 3.2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

PASSKEY_PICTURE = "passkey_grid.png"
"""Drawn instead of accuracy against length for the passkey task."""


def is_passkey(rows: list[dict[str, Any]] | None) -> bool:
    """Whether accuracy rows are a passkey grid (``lm.evaluate.passkey_accuracy``'s)."""
    return bool(rows) and "depths" in rows[0]


def passkey_k_max(rows: list[dict[str, Any]]) -> int | None:
    from lm.evaluate import k_max  # here: the report loads no model unless a passkey asks

    return k_max(rows)


def passkey_section(
    results: list[Any], header: str, labels: list[str], mean_std: Callable[..., str]
) -> list[str]:
    """The passkey runs' section: each group's k_max and accuracy per length as ``mean_std``
    over its seeds (``lm.compare.report``'s), then each run's, and the heatmaps of their
    grids; ``labels``: each run's row, as table cells."""
    passkey = [(r, label) for r, label in zip(results, labels, strict=True) if r.accuracy]
    lengths = sorted({row["length"] for r, _ in passkey for row in r.accuracy})
    first = passkey[0][0].accuracy[0]
    keys, depths = first["depths"][0]["examples"], len(first["depths"])
    at = " | ".join(f"@{n}" for n in lengths)
    lines = [
        "## Passkey retrieval by length and depth",
        "",
        f"Each run is asked {keys} passkeys per length and depth of the key ({depths} depths "
        "from the filler's start to its end; `lm.evaluate.passkey_accuracy`, the code behind "
        "`lm eval`); a key counts only if all 5 digits are the model's likeliest. `k_max` is "
        "Position Interpolation's: the longest length at which it and every shorter one "
        "retrieve at least 20% of the keys, over all depths (none: the shortest does not). A "
        "cell is a length's accuracy over all depths, first mean ± std over seeds (a k_max "
        "that is none in some seed: each seed's), then each run's; report.json has every cell.",
        "",
        f"| {header} | seeds | k_max | {at} |",
        "|---|---:|---:|" + "---:|" * len(lengths),
    ]
    groups: dict[str, list[Any]] = {}
    for r, label in passkey:
        groups.setdefault(label, []).append(r)
    for label, runs in groups.items():
        found = [{row["length"]: row["accuracy"] for row in r.accuracy} for r in runs]
        cells = [mean_std([f.get(n) for f in found], ".1%") for n in lengths]
        k = [passkey_k_max(r.accuracy) for r in runs]
        shown = ", ".join("none" if x is None else str(x) for x in k)
        k_cell = shown if None in k else mean_std(k, ".0f")
        lines.append(f"| {label} | {len(runs)} | {k_cell} | " + " | ".join(cells) + " |")
    lines += ["", f"| {header} | seed | k_max | {at} |", "|---|---:|---:|" + "---:|" * len(lengths)]
    for r, label in passkey:
        found = {row["length"]: row["accuracy"] for row in r.accuracy}
        cells = [
            "n/a" if found.get(n) is None else f"{found[n]:.1%}" for n in lengths
        ]  # n/a: not asked at that length, or out of the model's reach
        k = passkey_k_max(r.accuracy)
        lines.append(
            f"| {label} | {r.seed} | {k if k is not None else 'none'} | " + " | ".join(cells) + " |"
        )
    return [*lines, "", f"![passkey accuracy by length and depth]({PASSKEY_PICTURE})", ""]


def draw_passkey(tasks: dict[str, list[Any]], path: Path) -> None:
    """Every passkey run's grid, one heatmap each, named by its group and seed."""
    from lm.compare import plots

    grids, found = {}, {}
    for label, runs in tasks.items():
        for r in runs:
            name = f"{label} seed {r.seed}"
            cells = [
                [math.nan if c["accuracy"] is None else c["accuracy"] for c in row["depths"]]
                for row in r.accuracy
            ]
            depths = [c["depth"] for c in r.accuracy[0]["depths"]]
            grids[name] = ([row["length"] for row in r.accuracy], depths, cells)
            found[name] = passkey_k_max(r.accuracy)
    plots.passkey_heatmaps(grids, found, path)
