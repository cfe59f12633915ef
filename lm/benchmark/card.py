"""The card: a scheme's scores against the builtins' references, as card.json (its schema in
docs/bench.md), card.md and the terminal's table.

Per score: the scheme's mean ± std over its seeds, its rank among the builtins the reference
holds, the best of them, and a verdict against RoPE and against the best. A verdict is
``better``, ``worse`` or ``level`` (the means differ by less than the score's resolution), and
beyond the seed spread when the difference of means is larger than the larger of the two
standard deviations; with one seed on either side there is no spread to say it against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lm.benchmark import battery as batteries
from lm.benchmark.battery import BUILTINS, Score, builtin_of
from lm.config.errors import LMError

VERSION = 1
REFERENCES = Path(__file__).with_name("references.json")
MARK = "<!-- lm bench card -->"
"""card.md's first line: how lm knows a card it wrote (card.json: ``generator``)."""


def battery_settings(battery: str) -> dict[str, Any]:
    """What decides a battery's numbers, kept with its references: a reference made with other
    settings is not used."""
    return {
        b.name: {
            "config": b.config,
            "settings": list(b.settings(battery)),
            "lengths": list(b.lengths),
            "eval_batches": b.quick_batches if battery == "quick" else None,
        }
        for b in batteries.benchmarks(battery)
    }


def read_references(path: Path = REFERENCES) -> dict[str, Any]:
    """The shipped references (none yet: an empty set)."""
    if not path.is_file():
        return {"version": VERSION, "batteries": {}}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise LMError(f"{path}: not the references lm ships ({e})") from None


def usable(references: dict[str, Any], battery: str) -> tuple[dict[str, Any], str]:
    """The builtins' references for ``battery`` that this battery can be compared with, and a
    note saying what is missing ('' when every builtin is there)."""
    made = references.get("batteries", {}).get(battery)
    again = "python scripts/bench_references.py" + (" --quick" if battery == "quick" else "")
    if not made or not made.get("schemes"):
        return {}, f"no {battery} reference exists yet ({again} makes them): no ranks, no verdicts"
    if made.get("settings") != battery_settings(battery):
        return {}, (
            f"the {battery} references were made with other battery settings ({again} remakes "
            "them): none used, no ranks, no verdicts"
        )
    schemes = made["schemes"]
    missing = [s for s in BUILTINS if s not in schemes]
    if not missing:
        return schemes, ""
    return schemes, (
        f"the {battery} references hold {len(schemes)} of {len(BUILTINS)} builtins (not "
        f"{', '.join(missing)}): ranks are among those"
    )


def verdict(mine: dict[str, Any], theirs: dict[str, Any], score: Score) -> dict[str, Any] | None:
    """``mine`` against ``theirs`` (each a stat: values, mean, std) on ``score``."""
    if mine["mean"] is None or theirs["mean"] is None:
        return None
    sign = 1 if score.higher_is_better else -1
    difference = sign * (mine["mean"] - theirs["mean"])  # > 0: better
    word = "level" if abs(difference) < score.resolution else "better"
    word = "worse" if word == "better" and difference < 0 else word
    spread, beyond = None, None
    if len(mine["values"]) > 1 and len(theirs["values"]) > 1:
        spread = max(mine["std"], theirs["std"])
        beyond = word != "level" and abs(difference) > spread
    if spread is None:
        said = f"{word} (1 seed: no spread)"
    elif word == "level":
        said = "level"
    else:
        said = f"{word}, {'beyond' if beyond else 'within'} the spread"
    return {
        "difference": difference,
        "verdict": word,
        "spread": spread,
        "beyond_spread": beyond,
        "said": said,
    }


def score_row(
    me: str | None, key: str, score: Score, mine: dict[str, Any], refs: dict[str, Any]
) -> dict[str, Any]:
    """One score's line of the card; ``me``: the scheme's name among the builtins, if one."""
    theirs = {
        n: r["scores"][key]
        for n, r in refs.items()
        if r["scores"].get(key, {}).get("mean") is not None
    }
    sign = 1 if score.higher_is_better else -1
    others = {n: s for n, s in theirs.items() if n != me}
    rank = None
    if mine["mean"] is not None and others:
        ahead = [
            s for s in others.values() if sign * (s["mean"] - mine["mean"]) >= score.resolution
        ]
        rank = 1 + len(ahead)
    best = max(theirs, key=lambda n: sign * theirs[n]["mean"], default=None)
    benchmark, _, name = key.partition(": ")
    return {
        "id": key,
        "benchmark": benchmark,
        "score": name,
        "what": score.what,
        "higher_is_better": score.higher_is_better,
        **mine,
        "rank": rank,
        "of": len(others) + 1 if others else None,
        "best": None if best is None else {"scheme": best, **theirs[best]},
        "builtins": {n: s["mean"] for n, s in theirs.items()},
        "against_rope": verdict(mine, theirs["rope"], score) if "rope" in theirs else None,
        "against_best": None if best is None else verdict(mine, theirs[best], score),
    }


def make_card(
    spec: str,
    battery: str,
    overrides: list[str],
    mine: dict[str, Any],
    references: dict[str, Any],
) -> dict[str, Any]:
    """card.json: ``mine`` (:func:`lm.benchmark.run.summary` of the scheme's runs) against the
    references of ``battery``."""
    refs, note = usable(references, battery)
    notes = [note] if note else []
    # A builtin benched (its position and settings) is ranked among the others; anything else,
    # a builtin with other settings too, among every builtin.
    me = builtin_of(spec, overrides)
    if overrides and me is None:
        notes.append(
            f"--set {' '.join(overrides)} changes the battery; the references are the battery's "
            "as shipped, so ranks and verdicts compare runs that differ by these settings"
        )
    rows = [
        score_row(me, key, score, mine["scores"][key], refs)
        for key, score in batteries.scores().items()
        if key in mine["scores"]
    ]
    lengths = list(mine["curve"])
    return {
        "generator": "lm bench",
        "version": VERSION,
        "scheme": spec,
        "battery": battery,
        "seeds": list(batteries.SEEDS[battery]),
        "settings": list(overrides),
        "references": {
            "schemes": [n for n in BUILTINS if n in refs],
            "machine": sorted({r.get("machine", "unknown") for r in refs.values()}),
            "notes": notes,
        },
        "scores": rows,
        "curve": {
            "lengths": lengths,
            "scheme": mine["curve"],
            "references": {
                n: {k: r["curve"].get(k, {}).get("mean") for k in lengths} for n, r in refs.items()
            },
        },
    }


def stat_text(stat: dict[str, Any] | None, score: Score) -> str:
    if stat is None or stat["mean"] is None:
        return "n/a"
    if stat["std"] is None:
        return score.text(stat["mean"])
    return f"{score.text(stat['mean'])} ± {score.text(stat['std'])}"


def markdown(card: dict[str, Any]) -> str:
    """card.md (after its :data:`MARK`) and the terminal's: the table, the curve, the notes."""
    scores = batteries.scores()
    seeds = card["seeds"]
    lines = [
        f"# lm bench: {card['scheme']}",
        "",
        f"The {card['battery']} battery, {len(seeds)} seed{'s' * (len(seeds) > 1)} "
        f"({', '.join(map(str, seeds))}); against the {card['battery']} references of "
        f"{schemes_text(len(card['references']['schemes']))} (docs/bench.md).",
        "",
        "| benchmark | score | this scheme | rank | best builtin | against RoPE "
        "| against the best |",
        "|---|---|---:|---:|---|---|---|",
    ]
    for row in card["scores"]:
        score = scores[row["id"]]
        way = "higher is better" if row["higher_is_better"] else "lower is better"
        rank = "n/a" if row["rank"] is None else f"{row['rank']} of {row['of']}"
        best = (
            "n/a"
            if row["best"] is None
            else f"{row['best']['scheme']} {stat_text(row['best'], score)}"
        )
        rope = "n/a" if row["against_rope"] is None else row["against_rope"]["said"]
        top = "n/a" if row["against_best"] is None else row["against_best"]["said"]
        lines.append(
            f"| {row['benchmark']} | {row['score']} ({way}) | {stat_text(row, score)} | {rank} "
            f"| {best} | {rope} | {top} |"
        )
    lines += _curve_lines(card)
    notes = card["references"]["notes"]
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def schemes_text(n: int) -> str:
    return f"{n} builtin scheme{'s' * (n != 1)}"


def _curve_lines(card: dict[str, Any]) -> list[str]:
    """The length curve: the scheme's validation loss at each length, and RoPE's and the
    curve's best builtin's references."""
    curve = card["curve"]
    if not curve["lengths"]:
        return []
    row = next((r for r in card["scores"] if r["what"] == "loss"), None)
    shown = {"this scheme": {k: v["mean"] for k, v in curve["scheme"].items()}}
    for name in ("rope", row and row["best"] and row["best"]["scheme"]):
        if name and name in curve["references"]:
            shown[name] = curve["references"][name]
    head = " | ".join(curve["lengths"])
    lines = [
        "",
        "Validation loss (nats per character) by context, as a multiple of the trained one:",
        "",
    ]
    lines += [f"| | {head} |", "|---|" + "---:|" * len(curve["lengths"])]
    for name, values in shown.items():
        cells = ["n/a" if values.get(k) is None else f"{values[k]:.3f}" for k in curve["lengths"]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines
