"""What a page shows, gathered from a run or a comparison: the prompt's tokens and maps, the
same prompt continued to 4x the trained context, the scheme's signal against distance, a task
run's evaluated examples, and a comparison's curves. Plain data (lists, numbers, strings) that
:mod:`lm.explorer.page` embeds as JSON; nothing is written anywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lm.compare.diagnostics import token_text
from lm.config.errors import LMError
from lm.config.names import Place, task_of
from lm.data.tasks import TaskSettings, evaluation_examples, splits
from lm.evaluate import EVAL_FILE, PASSKEY_SUCCESS
from lm.explorer import maps as measure
from lm.explorer.signal import signal_charts, undrawn
from lm.runs.checkpoint import complete_checkpoints, read_state
from lm.runs.directory import CONFIG
from lm.runs.load import LoadedRun, load_run
from lm.runtime.device import seeded_draws
from lm.sample import generate
from lm.training.metrics import read_metrics

LONG = 4
"""The longer view: the prompt continued to this many times the trained context."""
EXAMPLES = 2
"""A task run's evaluated examples shown per split and length."""
REPORT = "report.json"


def prompt_ids(run: LoadedRun, text: str, flag: str = "--prompt") -> list[int]:
    """The prompt's tokens; one line when it is empty, holds characters the run's vocabulary
    lacks (naming them), or is longer than the model can read or the page shows."""
    if not text:
        raise LMError(f"{flag}: empty; give the text whose attention to show")
    tok = run.tokenizer
    if tok.count_unknown(text):
        unknown = sorted({c for c in text if tok.count_unknown(c)})
        raise LMError(
            f"{flag}: {', '.join(map(repr, unknown))} not in the run's vocabulary "
            f"({len(unknown)} character(s)); use only characters the run trained on"
        )
    ids = tok.encode(text)
    C = run.config.model.context_length
    limit = C if any(r.table for r in run.config.model.rows) else LONG * C
    if len(ids) > limit:
        why = "learned position table has" if limit == C else f"page shows {LONG}x its context,"
        raise LMError(
            f"{flag}: {len(ids)} tokens, but this run's {why} {limit} positions; shorten it to "
            f"at most {limit} tokens"
        )
    return ids


def longer(run: LoadedRun, ids: list[int], length: int) -> list[int]:
    """``ids`` continued greedily to ``length`` tokens; where the model ends the document, the
    end of document is kept and the prompt starts again, and the text goes on from there."""
    tok = run.tokenizer
    out = list(ids)
    while len(out) < length:
        new = generate(run.model, [out], length - len(out), tok.pad_id, tok.eod_id)[0]
        out += new if len(out) + len(new) >= length else [*new, tok.eod_id, *ids]
    return out[:length]


def _long_view(run: LoadedRun, text: list[int]) -> dict[str, Any]:
    """The prompt continued to 4x the context, ``text``: the 1x and 4x maps (pooled for
    drawing), each head's entropy and histogram of attended distances at both lengths."""
    C = run.config.model.context_length
    edges = measure.distance_edges(len(text))
    views = {}
    for name, part in (("1x", text[:C]), (f"{LONG}x", text)):
        maps = measure.attention_maps(run.model, part)
        pictures, block = measure.pooled(maps)
        views[name] = {
            "tokens": len(part),
            "pictures": pictures,
            "cells": -(-len(part) // block),
            "block": block,
            "entropy": measure.entropy(maps).round(4).tolist(),
            "histogram": measure.distance_histogram(maps, edges).round(5).tolist(),
        }
    return {
        "text": [token_text(run.tokenizer, i) for i in text],
        "edges": edges,
        "factor": LONG,
        "views": views,
    }


def _flipflop_distance(prompt: str) -> int:
    """Instructions from the final read back to the last write."""
    return (len(prompt) - 1 - prompt.rindex("w")) // 2


def task_examples(run: LoadedRun) -> list[dict[str, Any]] | None:
    """A task run's first :data:`EXAMPLES` evaluation examples per split and length (the first
    of those ``lm eval`` scores), each with the model's greedy answer and whether it is right; for
    flip-flop, the distance from the read back to the last write."""
    data = run.config.data
    task = task_of(data.source)
    if task is None:
        return None
    tok = run.tokenizer
    rows = []
    for index, (split, settings) in enumerate(splits(task, TaskSettings.of(data))):
        for length in data.task_ranges()[1]:
            pairs = evaluation_examples(task, length, EXAMPLES, data.seed, settings, index)
            answers = [tok.encode(a) for _, a in pairs]
            got = generate(
                run.model,
                [tok.encode(p) for p, _ in pairs],
                max(map(len, answers)) + 1,
                tok.pad_id,
                tok.eod_id,
            )
            for (prompt, answer), want, said in zip(pairs, answers, got, strict=True):
                row = {"split": split, "length": length, "prompt": prompt, "answer": answer}
                row.update(said=tok.decode(said), correct=said == want)
                if task == "flipflop":
                    row["distance"] = _flipflop_distance(prompt)
                rows.append(row)
    return rows


def _describe(run: LoadedRun, name: str) -> dict[str, Any]:
    c = run.config.model
    return {
        "name": name,
        "scheme": c.position_text,
        "normalize": c.normalize,
        "bias": any(r.place is Place.SCORES for r in c.rows),
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "context": c.context_length,
        "step": run.step,
    }


def prompt_view(run: LoadedRun, text: str, long: bool = True) -> dict[str, Any]:
    """The page's data for ``text``: its tokens, every layer's and head's map, the signal
    charts and (with ``long``) the 4x view."""
    ids = prompt_ids(run, text)
    device = next(run.model.parameters()).device
    with seeded_draws(device, run.config.train.seed, ids):  # positions drawn at evaluation
        return _prompt_view(run, text, ids, long)


def _prompt_view(run: LoadedRun, text: str, ids: list[int], long: bool) -> dict[str, Any]:
    scores, maps = measure.both_maps(run.model, ids)
    C = run.config.model.context_length
    if any(r.table for r in run.config.model.rows):
        reach, view = ids, {"note": f"a learned position table stops at {C} positions: no 4x view"}
    elif long:
        reach = longer(run, ids, LONG * C)
        view = _long_view(run, reach)
    else:  # positions alone need no text of that length: the prompt repeated reaches it
        reach, view = (ids * (LONG * C))[: LONG * C], {"note": "the 4x view is on each run's page"}
    return {
        "prompt": text,
        "tokens": [token_text(run.tokenizer, i) for i in ids],
        "weights": measure.rows(maps),
        "scores": measure.signed_rows(scores),
        "heads": measure.head_grid(run.model, run.tokenizer, run.config.train.seed),
        "signals": signal_charts(run.model, ids, reach, maps),
        "undrawn": undrawn(run.model),
        "long": view,
    }


SCRUBBED = ("weights", "scores", "heads", "signals")
"""What the page's scrubber moves through training: the maps at the prompt's length (never the
4x view), the head grid, the signal."""
MAX_STEPS = 8
"""Checkpoints a page holds unless ``--steps`` names them: every one up to this many, else this
many evenly chosen, the first and the last among them."""


def chosen_checkpoints(run_dir: Path, steps: list[int] | None) -> list[Path]:
    """The checkpoints a run's page scrubs through, oldest first: those ``steps`` names (one line
    naming the steps there are when one has none), else :data:`MAX_STEPS` of them, evenly."""
    found = {read_state(p)["step"]: p for p in complete_checkpoints(run_dir)}
    if steps is None:
        kept = sorted(found)
        if len(kept) > MAX_STEPS:  # evenly over the list, the first and the last kept
            kept = [kept[round(i * (len(kept) - 1) / (MAX_STEPS - 1))] for i in range(MAX_STEPS)]
        return [found[s] for s in kept]
    missing = [s for s in steps if s not in found]
    if missing:
        there = ", ".join(map(str, sorted(found))) or "none"
        raise LMError(
            f"--steps: no checkpoint at step {', '.join(map(str, missing))} in {run_dir}; "
            f"the run has checkpoints at steps {there}"
        )
    return [found[s] for s in sorted(set(steps))]


def checkpoint_views(run: LoadedRun, text: str, others: list[Path]) -> list[dict[str, Any]]:
    """:data:`SCRUBBED` of the prompt at each of ``others`` (checkpoints of ``run``'s folder),
    with the step it had trained."""
    views = []
    for path in others:
        earlier = load_run(run.run_dir, path, str(next(run.model.parameters()).device))
        view = prompt_view(earlier, text, long=False)
        views.append({"step": earlier.step, **{k: view[k] for k in SCRUBBED}})
    return views


def passkey_grid(run: LoadedRun) -> dict[str, Any] | None:
    """A passkey run's accuracy grid by length and depth and its k_max, as ``lm eval`` last
    wrote them to the run's eval.json (``rows``, ``k_max``, ``step``), or a ``note`` saying how to
    have them; None for any other run. (Not computed here: the grid asks every depth at every
    length up to past the context, minutes on a CPU.)"""
    if task_of(run.config.data.source) != "passkey" or run.run_dir is None:
        return None
    path = run.run_dir / EVAL_FILE
    if not path.is_file():
        return {"note": f"no {EVAL_FILE} yet: lm eval {run.run_dir} measures the passkey grid"}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        rows, step = found["accuracy"], int(found["step"])
        if not (isinstance(rows, list) and rows and all("depths" in r for r in rows)):
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):
        return {"note": f"{path}: not a passkey grid lm eval wrote; lm eval {run.run_dir} again"}
    return {"rows": rows, "k_max": found.get("k_max"), "success": PASSKEY_SUCCESS, "step": step}


def run_page(
    run: LoadedRun,
    text: str,
    name: str,
    task: list[dict[str, Any]] | None = None,
    steps: list[int] | None = None,
) -> dict[str, Any]:
    """A run's page data (``task``: its :func:`task_examples`, if already gathered), with the
    maps at the checkpoints before ``run``'s that ``steps`` names (default
    :func:`chosen_checkpoints`' choice) for the scrubber."""
    view = prompt_view(run, text)  # the prompt checked before the examples' slow work
    task = task_examples(run) if task is None else task
    chosen = [] if run.run_dir is None else chosen_checkpoints(run.run_dir, steps)
    others = [p for p in chosen if read_state(p)["step"] < run.step]
    described = {**_describe(run, name), **view, "task": task, "passkey": passkey_grid(run)}
    described["checkpoints"] = checkpoint_views(run, text, others)
    return {"kind": "run", "title": name, "runs": [described], "curves": []}


def _report(compare_dir: Path) -> dict[str, Any]:
    try:
        report = json.loads((compare_dir / REPORT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        report = None
    if not (isinstance(report, dict) and isinstance(report.get("runs"), list)):
        raise LMError(f"{compare_dir / REPORT}: not a report lm compare wrote")
    return report


def _run_dir(compare_dir: Path, recorded: str) -> Path:
    """A compared run's folder: as recorded (relative to where lm compare ran), else the same
    tail under the comparison's folder (moved or copied since)."""
    path = Path(recorded)
    if (path / CONFIG).is_file():
        return path
    parts = path.parts
    for i in range(len(parts)):
        tail = compare_dir.joinpath(*parts[i:])
        if (tail / CONFIG).is_file():
            return tail
    raise LMError(f"{compare_dir}: the compared run {recorded} is not there")


def _curves(runs: list[tuple[str, Path, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The report's curves: validation loss against step (each run's metrics.jsonl), against
    evaluation length, and a task's accuracy against length (per split for flip-flop)."""
    step, length, accuracy = [], [], []
    for label, run_dir, row in runs:
        logged = [r for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r]
        step.append({"label": label, "x": [r["step"] for r in logged],
                     "y": [r["val_loss"] for r in logged]})  # fmt: skip
        rows = [r for r in row.get("extrapolation") or [] if r.get("loss") is not None]
        length.append({"label": label, "x": [r["context_length"] for r in rows],
                       "y": [r["loss"] for r in rows]})  # fmt: skip
        by_split: dict[str | None, list] = {}
        for r in row.get("accuracy") or []:
            by_split.setdefault(r.get("split"), []).append(r)
        for split, rs in by_split.items():
            name = label if split is None else f"{label}, {split}"
            accuracy.append({"label": name, "x": [r["length"] for r in rs],
                             "y": [r["accuracy"] for r in rs]})  # fmt: skip
    charts = [
        {"title": "validation loss against step", "xlabel": "step", "ylabel": "val loss",
         "series": step},
        {"title": "validation loss against evaluation length", "xlabel": "tokens",
         "ylabel": "val loss", "series": length},
    ]  # fmt: skip
    if accuracy:
        charts.append({"title": "exact-match accuracy against length", "xlabel": "length",
                       "ylabel": "accuracy", "series": accuracy})  # fmt: skip
    # A chart needs two x values: one point per run (evaluated once, at one length) is a table's
    # row, which the report has, not a curve.
    return [c for c in charts if len({x for s in c["series"] for x in s["x"]}) > 1]


def compared_runs(compare_dir: Path) -> tuple[dict[str, Any], list[tuple[str, Path, dict]]]:
    """A comparison's report and, for each compared value, its first run (lowest seed): label,
    folder and the report's numbers."""
    report = _report(compare_dir)
    firsts: dict[str, dict] = {}
    for row in sorted(report["runs"], key=lambda r: r.get("seed", 0)):
        if row.get("rope_scaling") is None:  # a re-evaluation is the same weights again
            firsts.setdefault(str(row.get("label")), row)
    if not firsts:
        raise LMError(f"{compare_dir / REPORT}: lists no runs")
    return report, [(k, _run_dir(compare_dir, r["run_dir"]), r) for k, r in firsts.items()]


def compare_page(compare_dir: Path, text: str | None, device: str) -> dict[str, Any]:
    """A comparison's page data: each compared run on one prompt (the report's unless
    ``text``), side by side, and the report's curves."""
    report, runs = compared_runs(compare_dir)
    text = report.get("prompt", "") if text is None else text
    shown = []
    for label, run_dir, _ in runs:
        run = load_run(run_dir, device=device)
        try:
            shown.append({**_describe(run, label), **prompt_view(run, text, long=False)})
        except LMError as e:
            raise LMError(f"{label}: {e}") from None
    return {
        "kind": "compare",
        "title": f"{compare_dir.name}: {report.get('compared', 'runs')} compared",
        "runs": shown,
        "curves": _curves(runs),
    }
