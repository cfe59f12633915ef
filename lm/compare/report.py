"""The comparison report: a pure function of what was measured of each run.

:func:`write_report` takes one :class:`RunResult` per run (measured by ``lm.compare.sweep``, or made
by hand) and writes ``report.md`` (a table with one row per compared value, mean ± std over seeds; a
table of validation loss at each evaluation length; then every run's greedy continuation),
``report.json`` (every number, per run) and three pictures drawn by ``lm.compare.plots``: loss
against step and against wall time, and validation loss against evaluation context length (length
extrapolation). Runs on a generated task add a table and a picture of exact-match accuracy
against length, the trained lengths marked. No model is loaded and nothing is trained here.

What the runs compare is read from their configs (:func:`lm.config.config_diff`): the key that
differs between them, other than the seed, names the table's first column. A RoPE run measured
with another context extension at evaluation time (``RunResult.rope_scaling``) is its own row
of the length table and its own line of the length plot (``rope + yarn:4``): the same trained
runs, no retraining, so the training table lists them once.
"""

from __future__ import annotations

import collections
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lm.compare.passkey import (
    PASSKEY_PICTURE,
    draw_passkey,
    is_passkey,
    passkey_k_max,
    passkey_section,
)
from lm.config.errors import LMError
from lm.config.load import config_diff, flatten
from lm.config.names import task_of
from lm.config.sections import Config
from lm.config.values import value_text
from lm.data.tasks import TaskSettings, split_notes

if TYPE_CHECKING:
    from lm.compare import plots

PICTURES = ("loss_vs_step.png", "loss_vs_time.png", "loss_vs_context.png")
ACCURACY_PICTURE = "accuracy_vs_length.png"
"""Drawn too when the runs trained on a generated task."""
SPLIT_PICTURE = "errors_by_split.png"
"""Drawn instead for a task asked in splits (flip-flop, counting, selective copy)."""
# Keys that differ between runs without being what they compare; threads too, which lm compare
# --jobs sets per run (its last run trains alone on every core) and which leaves the numbers.
NOT_COMPARED = ("model.vocab_size", "train.seed", "train.threads")
# Keys that change how a run is watched, saved or placed, not what it learns: the labels leave
# them out unless nothing else differs.
HOUSEKEEPING = (
    "data.cache_dir",
    *(
        f"train.{key}"
        for key in (
            "eval_every", "eval_steps", "eval_batch_size", "checkpoint_every",
            "keep_checkpoints", "log_every", "device", "compile", "tensorboard",
            "on_checkpoint_error", "threads",
        )
    ),
)  # fmt: skip


@dataclass(frozen=True)
class RunResult:
    """What was measured of one run."""

    run_dir: Path
    config: Config
    """The run's resolved config (config.yaml)."""
    parameters: int
    step: int
    tokens_seen: int
    tokens_exact: bool
    """False when counted from the logged throughput (padded batches hold a varying count)."""
    final_val_loss: float | None
    best_val_loss: float | None
    tokens_per_s: float | None
    """Median of the logged training throughputs."""
    wall_s: float | None
    extrapolation: list[dict[str, Any]]
    """``lm.evaluate.evaluate_lengths``'s rows, one per evaluation length: ``context_length``,
    ``requested`` (``"2x"`` or ``"256"``), ``loss`` (None when there is none), the ``windows``
    read and the longest ``window``, and a ``note`` saying why a loss is missing or what it
    measured instead."""
    continuation: str
    """The greedy continuation of the report's prompt, without the prompt."""
    tokenizer_sha256: str
    data_cache: str | None
    """The token-id cache the run's checkpoint names."""
    eval_batches: int | None
    """Batches per context length of the extrapolation evaluation (None: the whole split)."""
    metrics: list[dict[str, Any]]
    """The run's metrics.jsonl records, for the loss curves."""
    prompt_unknown: int = 0
    """Characters of the continued prompt that are not in the run's vocabulary (became <unk>)."""
    rope_scaling: str | None = None
    """The RoPE context extension the evaluation used instead of the trained one (``pi:4``;
    ``none`` removes a trained one); None: evaluated as trained."""
    accuracy: list[dict[str, Any]] | None = None
    """A task run's ``lm.evaluate.task_accuracy`` rows, one per length: ``length``,
    ``accuracy``, ``correct``, ``examples``, ``trained``; None for a run on text."""

    @property
    def seed(self) -> int:
        return self.config.train.seed

    @property
    def trained_context(self) -> int:
        return self.config.model.context_length

    def to_json(self, label: str) -> dict[str, Any]:
        """The run's numbers in report.json (its metrics stay in its own metrics.jsonl)."""
        return {
            "run_dir": str(self.run_dir),
            "label": label,
            "seed": self.seed,
            "parameters": self.parameters,
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "tokens_exact": self.tokens_exact,
            "final_val_loss": self.final_val_loss,
            "best_val_loss": self.best_val_loss,
            "tokens_per_s": self.tokens_per_s,
            "wall_s": self.wall_s,
            "extrapolation": self.extrapolation,
            "continuation": self.continuation,
            "tokenizer_sha256": self.tokenizer_sha256,
            "data_cache": self.data_cache,
            "trained_context": self.trained_context,
            "eval_batches": self.eval_batches,
            "rope_scaling": self.rope_scaling,
            "accuracy": self.accuracy,
            **({"k_max": passkey_k_max(self.accuracy)} if is_passkey(self.accuracy) else {}),
        }


def compared_keys(configs: list[Config]) -> list[str]:
    """The dotted keys whose values differ between the runs (seed and housekeeping aside)."""
    diffs = [config_diff(configs[0], c) for c in configs[1:]]
    varied = [
        k for k in flatten(configs[0]) if k not in NOT_COMPARED and any(k in d for d in diffs)
    ]
    return [k for k in varied if k not in HOUSEKEEPING] or varied


def labels(configs: list[Config]) -> tuple[str, list[str]]:
    """The compared keys' short name and each run's value(s) of them."""
    flat = [flatten(c) for c in configs]
    varied = compared_keys(configs)
    if not varied:  # nothing differs but the seed: one group
        return "run", ["same config"] * len(configs)
    if len(varied) == 1:
        return varied[0].split(".")[-1], [value_text(f[varied[0]]) for f in flat]
    # Several keys: each run names the key of most values, and another key only where it
    # leaves the value most runs share (stick-breaking is "position=none,
    # normalize=stick_breaking"; the softmax runs say nothing of normalize). Where no key has
    # the most values (a sweep of parts, each changed once), each run names what it changes,
    # and a run that changes nothing names every key.
    texts = {k: [value_text(f[k]) for f in flat] for k in varied}
    most = max(len(set(texts[k])) for k in varied)
    leads = [k for k in varied if len(set(texts[k])) == most]
    usual = {}
    for k in varied:
        value, n = collections.Counter(texts[k]).most_common(1)[0]
        usual[k] = value if leads != [k] and n > len(flat) / 2 else None  # no majority: all name it
    names = [
        ", ".join(f"{k.split('.')[-1]}={texts[k][i]}" for k in varied if texts[k][i] != usual[k])
        for i in range(len(flat))
    ]
    every = [
        ", ".join(f"{k.split('.')[-1]}={texts[k][i]}" for k in varied) for i in range(len(flat))
    ]
    return "runs", [name or every[i] for i, name in enumerate(names)]


def _mean_std(values: list[float | None], fmt: str) -> str:
    """``mean ± std`` over seeds (sample std); one value or all equal: the value alone; any
    missing: n/a."""
    if not values or any(v is None for v in values):
        return "n/a"
    if len(set(values)) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.mean(values), fmt)} ± {format(statistics.stdev(values), fmt)}"


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f}s"
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes}m {s:02d}s" if minutes else f"{s}s"


def _cell(text: str) -> str:
    """Text as one Markdown table cell: newlines visible, pipes escaped."""
    return text.replace("|", "\\|").replace("\n", "↵").replace("\r", "")


def _table(header: str, groups: dict[str, list[RunResult]]) -> list[str]:
    """The training table: one row per group of seeds, mean ± std."""
    columns = [header, "seeds", "parameters", "steps", "tokens seen", "final val loss"]
    columns += ["best val loss", "tokens/s", "wall time"]
    lines = ["| " + " | ".join(columns) + " |", "|---" + "|---:" * (len(columns) - 1) + "|"]
    for label, runs in groups.items():
        tokens = statistics.mean(r.tokens_seen for r in runs)
        walls = [r.wall_s for r in runs]
        cells = [
            _cell(label),
            str(len(runs)),
            f"{runs[0].parameters:,}",
            _mean_std([r.step for r in runs], ".0f"),
            ("" if runs[0].tokens_exact else "≈") + f"{tokens:,.0f}",
            _mean_std([r.final_val_loss for r in runs], ".4f"),
            _mean_std([r.best_val_loss for r in runs], ".4f"),
            _mean_std([r.tokens_per_s for r in runs], ",.0f"),
            "n/a" if None in walls else _duration(statistics.mean(walls)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _length_columns(groups: dict[str, list[RunResult]]) -> list[str]:
    first = next(iter(groups.values()))[0]
    trained = {runs[0].trained_context for runs in groups.values()}
    if len(trained) == 1:  # name the lengths; runs of different contexts share only the specs
        C = trained.pop()
        return [
            f"val loss @{row['context_length']} ({row['context_length'] / C:g}×)"
            for row in first.extrapolation
        ]
    return [f"val loss @{row['requested']}" for row in first.extrapolation]


def _length_table(header: str, groups: dict[str, list[RunResult]]) -> tuple[list[str], list[str]]:
    """Validation loss at each evaluation length, one row per group (evaluation-time RoPE
    extensions included), and its footnotes (why a cell says n/a, or what it measured)."""
    at = _length_columns(groups)
    lines = ["| " + " | ".join([header, *at]) + " |", "|---" + "|---:" * len(at) + "|"]
    notes: list[str] = []
    for label, runs in groups.items():
        cells = [_cell(label)]
        for i in range(len(at)):
            rows = [r.extrapolation[i] for r in runs]
            cell = _mean_std([row["loss"] for row in rows], ".4f")
            note = next((row["note"] for row in rows if row.get("note")), None)
            if note is not None:
                if note not in notes:
                    notes.append(note)
                cell += f" [{notes.index(note) + 1}]"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return lines, [f"[{i}] {note}" for i, note in enumerate(notes, 1)]


def _windows(results: list[RunResult]) -> str:
    """What each length read: its number of windows, when every run that has a loss there read
    the same (runs of one trained context on one split do)."""
    read: dict[int, set[Any]] = {}
    for r in results:
        for row in r.extrapolation:
            if row["loss"] is not None:
                read.setdefault(row["context_length"], set()).add(row.get("windows"))
    if not read or any(len(n) != 1 or None in n for n in read.values()):
        return "The windows each run read are in report.json."
    counts = ", ".join(f"{next(iter(n)):,} at {length}" for length, n in sorted(read.items()))
    return f"Windows read: {counts}."


def _sharing(results: list[RunResult]) -> str:
    """Whether the runs really shared one tokenizer and one set of token ids (checked, not
    assumed: the hash of every run's tokenizer.json and the cache its checkpoint names)."""
    tokenizers = {r.tokenizer_sha256 for r in results}
    caches = {r.data_cache for r in results}
    if len(tokenizers) == 1 and len(caches) == 1:
        return (
            f"All {len(results)} runs share one tokenizer (tokenizer.json sha256 "
            f"`{next(iter(tokenizers))[:16]}`) and one set of cached token ids "
            f"(`{Path(next(iter(caches)) or '?').name}`)."
        )
    return (
        f"The runs do not all share their data: {len(tokenizers)} distinct tokenizers and "
        f"{len(caches)} token-id caches (see report.json)."
    )


def _curves(groups: dict[str, list[RunResult]], x: str, y: str) -> plots.Curves:
    return {
        label: [
            ([m[x] for m in r.metrics if y in m], [m[y] for m in r.metrics if y in m]) for r in runs
        ]
        for label, runs in groups.items()
    }


def _draw(grouping: _Grouping, out_dir: Path) -> None:
    # Here, not above: a sweep's job imports this module to measure its run, and draws nothing
    # (matplotlib is a third of a job's start).
    from lm.compare import plots

    step, time, context = (out_dir / name for name in PICTURES)
    trained, groups = grouping.trained, grouping.groups
    if grouping.header not in ("run", "runs", "rope_scaling"):  # one key: legends name it
        trained = {f"{grouping.header}={label}": runs for label, runs in trained.items()}
        groups = {f"{grouping.header}={label}": runs for label, runs in groups.items()}
    panels = {
        x_name: {
            "training loss": _curves(trained, x, "train_loss"),
            "validation loss": _curves(trained, x, "val_loss"),
        }
        for x, x_name in (("step", "step"), ("elapsed_s", "wall time (s)"))
    }
    extrapolation = {
        label: [
            (
                [row["context_length"] for row in r.extrapolation],
                [math.nan if row["loss"] is None else row["loss"] for row in r.extrapolation],
            )
            for r in runs
        ]
        for label, runs in groups.items()
    }
    trained = {label: runs[0].trained_context for label, runs in groups.items()}
    plots.loss_curves(panels["step"], "step", step)
    plots.loss_curves(panels["wall time (s)"], "wall time (s)", time)
    if _tasks_only(r for runs in groups.values() for r in runs):
        context.unlink(missing_ok=True)  # a task's examples reach no context: accuracy instead
    else:
        plots.loss_vs_context(extrapolation, trained, context)
    tasks = {label: runs for label, runs in groups.items() if runs[0].accuracy is not None}
    if tasks and is_passkey(next(iter(tasks.values()))[0].accuracy):
        draw_passkey(tasks, out_dir / PASSKEY_PICTURE)
    elif tasks and "split" in next(iter(tasks.values()))[0].accuracy[0]:
        bins = _accuracy_bins([r for runs in tasks.values() for r in runs])
        seeds = {
            label: [[_mean_accuracy(r, keys, math.nan) for _, keys in bins] for r in runs]
            for label, runs in tasks.items()
        }
        plots.accuracy_by_split(seeds, [name for name, _ in bins], out_dir / SPLIT_PICTURE)
    elif tasks:
        curves = {
            label: [
                ([row["length"] for row in r.accuracy], [row["accuracy"] for row in r.accuracy])
                for r in runs
            ]
            for label, runs in tasks.items()
        }
        lengths = {label: _trained_lengths(runs[0]) for label, runs in tasks.items()}
        plots.accuracy_vs_length(curves, lengths, out_dir / ACCURACY_PICTURE)


def _tasks_only(results) -> bool:
    """Every run is on a generated task: what it measured is accuracy by length; its loss at
    a context length means nothing past its examples' own length."""
    return all(r.accuracy is not None for r in results)


def _trained_lengths(result: RunResult) -> range:
    lengths = [row["length"] for row in result.accuracy or [] if row["trained"]]
    return range(lengths[0], lengths[-1] + 1) if lengths else range(0)


def _key(row: dict[str, Any]) -> tuple[str | None, int]:
    """What an accuracy row measured: its split (a split task's, else None) and its length."""
    return row.get("split"), row["length"]


def _accuracy_bins(results: list[RunResult]) -> list[tuple[str, list[tuple[str | None, int]]]]:
    """The accuracy table's columns, over every length any run was asked at: the first run's
    trained lengths, the longer ones in up to four bins of consecutive lengths, and every
    unseen length together. Flip-flop's: one column per split (and length, if several)."""
    first = next(r for r in results if r.accuracy is not None)
    if "split" in first.accuracy[0]:
        return _split_bins(results, first)
    asked = sorted({row["length"] for r in results for row in r.accuracy or []})
    trained = [row["length"] for row in first.accuracy if row["trained"]]
    unseen = [n for n in asked if n not in trained]
    below = [n for n in unseen if trained and n < trained[0]]
    above = [n for n in unseen if n not in below]
    bins = [(_span(below), below)] if below else []
    if trained:
        bins.append((f"{_span(trained)} (trained)", trained))
    size = -(-len(above) // 4) if above else 0
    bins += [(_span(above[i : i + size]), above[i : i + size]) for i in range(0, len(above), size)]
    if unseen and len(bins) > 2:
        bins.append(("all unseen", unseen))
    return [(name, [(None, n) for n in lengths]) for name, lengths in bins]


def _split_bins(
    results: list[RunResult], first: RunResult
) -> list[tuple[str, list[tuple[str | None, int]]]]:
    """A split task's columns: one per split when every run was asked at one length, else per
    split its trained lengths and its longer ones (``dense @ 8–16``, ``dense @ 17–32``)."""
    asked = list(dict.fromkeys(_key(row) for r in results for row in r.accuracy or []))
    names = list(dict.fromkeys(s for s, _ in asked))
    if len({length for _, length in asked}) == 1:
        return [(str(s), [(s, n)]) for s, n in asked]
    trained = {row["length"] for row in first.accuracy if row["trained"]}
    bins = []
    for name in names:
        lengths = [n for s, n in asked if s == name]
        inside = [n for n in lengths if n in trained]
        outside = [n for n in lengths if n not in trained]
        for group in (inside, outside):
            if group:
                bins.append((f"{name} @ {_span(group)}", [(name, n) for n in group]))
    return bins


def _mean_accuracy(result: RunResult, keys: list, missing: float | None = None) -> float | None:
    """A run's accuracy over a column's (split, length) ``keys``, their mean; ``missing`` where
    it was asked at none of them."""
    found = [row["accuracy"] for row in result.accuracy if _key(row) in keys]
    return statistics.mean(found) if found else missing


def _span(lengths: list[int]) -> str:
    return f"{lengths[0]}–{lengths[-1]}" if len(lengths) > 1 else str(lengths[0])


def _accuracy_table(header: str, groups: dict[str, list[RunResult]]) -> list[str]:
    """Exact-match accuracy, one row per group: each cell the mean over the column's lengths,
    then mean ± std over seeds; n/a where a run was asked at none of the column's lengths."""
    runs_of = [r for runs in groups.values() for r in runs if r.accuracy is not None]
    bins = _accuracy_bins(runs_of)
    lines = ["| " + " | ".join([header, *(name for name, _ in bins)]) + " |"]
    lines.append("|---" + "|---:" * len(bins) + "|")
    for label, runs in groups.items():
        if runs[0].accuracy is None:
            continue
        means = [[_mean_accuracy(r, keys) for r in runs] for _, keys in bins]
        cells = [_cell(label), *(_mean_std(m, ".1%") for m in means)]
        lines.append("| " + " | ".join(cells) + " |")
    layouts = {tuple((*_key(row), row["trained"]) for row in r.accuracy) for r in runs_of}
    tasks = list(dict.fromkeys(r.config.data.source for r in runs_of))
    if len(tasks) > 1:
        lines += [
            "",
            f"The runs are of {len(tasks)} tasks ({', '.join(tasks)}): the columns are the first "
            f"run's, {tasks[0]}'s; n/a where a run of another task has no such column (report.json "
            "holds its accuracy).",
        ]
    elif len(layouts) > 1:
        lines += [
            "",
            "The runs were trained or asked at different lengths: the columns are every length "
            "any run was asked at, the trained one the first run's; n/a where a run has none.",
        ]
    return lines


def _budget(results: list[RunResult]) -> str:
    """How much of the validation split the extrapolation columns read."""
    budgets = {r.eval_batches for r in results}
    if budgets == {None}:
        return "the whole of"
    return f"the first {'/'.join(sorted(str(b) for b in budgets))} batches of"


@dataclass(frozen=True)
class _Grouping:
    header: str
    """What the runs compare: the first column's name."""
    labels: list[str]
    """Each result's row: its trained group, and the evaluation-time extension if any."""
    groups: dict[str, list[RunResult]]
    """The results by row label, in the order they came (the seeds of one value together)."""
    trained: dict[str, list[RunResult]]
    """Each trained run once, by its trained group (evaluation-time extensions left out)."""


def _grouped(results: list[RunResult]) -> _Grouping:
    if not results:
        raise LMError("compare: no runs to report on")
    header, names = labels([r.config for r in results])
    extended = [r.rope_scaling for r in results]
    if header == "run" and any(extended):  # one trained config: the rows are the extensions
        header = "rope_scaling"
        full = [
            e or r.config.model.rope_scaling or "none"
            for r, e in zip(results, extended, strict=True)
        ]
    else:
        full = [n if e is None else f"{n} + {e}" for n, e in zip(names, extended, strict=True)]
    groups: dict[str, list[RunResult]] = {}
    trained: dict[str, list[RunResult]] = {}
    seen: set[Path] = set()
    for r, name, label in zip(results, names, full, strict=True):
        groups.setdefault(label, []).append(r)
        if r.run_dir not in seen:
            seen.add(r.run_dir)
            trained.setdefault(name, []).append(r)
    return _Grouping(header, full, groups, trained)


def _accuracy_section(results: list[RunResult], g: _Grouping) -> list[str]:
    """The report's section of exact-match accuracy (by split for flip-flop, by length for the
    other tasks); none without a task."""
    if all(r.accuracy is None for r in results):
        return []
    first = next(r for r in results if r.accuracy is not None)
    if is_passkey(first.accuracy):
        return passkey_section(results, g.header, [_cell(label) for label in g.labels], _mean_std)
    examples = first.accuracy[0]["examples"]
    if "split" in first.accuracy[0]:
        data = first.config.data
        task = task_of(data.source)
        what = "reads the memory of" if task == "flipflop" else "answers"
        noun = "flip-flop programs" if task == "flipflop" else f"{task} prompts"
        by, picture = "split", f"![errors by split]({SPLIT_PICTURE})"
        how = (
            f"Each run {what} {examples} {noun} per split and length "
            f"greedily (`lm.evaluate.task_accuracy`, the code behind `lm eval`); the splits' "
            f"{split_notes(task, TaskSettings.of(data))}. A cell is the accuracy (the mean "
            "over its lengths), mean ± std over seeds."
        )
    else:
        by, picture = "length", f"![accuracy against length]({ACCURACY_PICTURE})"
        how = (
            f"Each run answers {examples} prompts of the task at every length greedily "
            "(`lm.evaluate.task_accuracy`, the code behind `lm eval`); an answer counts only "
            "if every token and the end of the document are right. A cell is the mean "
            "accuracy over its lengths, mean ± std over seeds; report.json has every length."
        )
    table = _accuracy_table(g.header, g.trained)
    return [f"## Exact-match accuracy by {by}", "", how, "", *table, "", picture, ""]


def render(
    results: list[RunResult], prompt: str, max_new_tokens: int
) -> tuple[str, dict[str, Any]]:
    """The report's Markdown (linking the :data:`PICTURES` beside it) and report.json's content."""
    g = _grouped(results)
    labelled = list(zip(results, g.labels, strict=True))
    extended = sorted({label for r, label in labelled if r.rope_scaling}, key=list(g.groups).index)
    lengths = _length_section(results, g, extended)
    # Runs on a generated task: the main table has the validation loss, accuracy the lengths.
    pictures = PICTURES[:2] if _tasks_only(results) else PICTURES
    trained = [r for runs in g.trained.values() for r in runs]
    lines = [
        f"# {_title(g.header, [r.config for r in results])}",
        "",
        f"{_counts(g.header, g.trained if extended else g.groups)} {_sharing(trained)}",
        "Losses are mean next-token cross-entropy in nats per token on the validation split, "
        "mean ± std over seeds.",
        "",
        *_table(g.header, g.trained),
        "",
        *lengths,
        *(f"![{Path(p).stem.replace('_', ' ')}]({p})" for p in pictures),
        "",
        *_accuracy_section(results, g),
        f"## Greedy continuations of “{prompt}”",
        "",
        *_unknown_note(results),
        f"| {g.header} | seed | continuation ({max_new_tokens} tokens at most; ↵ is a newline) |",
        "|---|---:|---|",
        *(
            f"| {_cell(label)} | {r.seed} | {_cell(prompt + r.continuation)} |"
            for r, label in labelled
        ),
        "",
    ]
    runs = [r.to_json(label) for r, label in labelled]
    return "\n".join(lines), {"compared": g.header, "prompt": prompt, "runs": runs}


def _length_section(results: list[RunResult], g: _Grouping, extended: list[str]) -> list[str]:
    """Validation loss by evaluation length, with its footnotes; none for runs on generated
    tasks only, whose loss at a context length means nothing past their examples' length.
    ``extended``: the rows of evaluation-time RoPE extensions."""
    lengths, notes = _length_table(g.header, g.groups)
    if _tasks_only(results):
        return []
    also = (
        f" {', '.join(f'`{label}`' for label in extended)}: the same trained runs, evaluated "
        "with that RoPE context extension in place of their own (`model.rope_scaling` replaced "
        "at evaluation time, no retraining)."
        if extended
        else ""
    )
    return [
        "## Validation loss by evaluation length",
        "",
        f"`val loss @N` is measured at context length N on {_budget(results)} the validation "
        "split, in non-overlapping windows of N tokens (every token a target once), by "
        "`lm.evaluate.evaluate_lengths` (the code behind `lm eval`). "
        f"{_windows(results)}{also}",
        "",
        *lengths,
        "",
        *(line for note in notes for line in (note, "")),
    ]


def _title(header: str, configs: list[Config]) -> str:
    if header == "run":
        return "Runs of one config"
    if header == "rope_scaling":  # one trained config, evaluated with each RoPE extension
        return "Runs compared by rope_scaling"
    return "Runs compared by " + ", ".join(k.split(".")[-1] for k in compared_keys(configs))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _counts(header: str, groups: dict[str, list[RunResult]]) -> str:
    """``6 runs: 3 values of position, 2 seeds each.``"""
    runs = sum(len(r) for r in groups.values())
    seeds = sorted({len(r) for r in groups.values()})
    unit = "combination" if header == "runs" else "value"
    each = _plural(seeds[0], "seed") + " each"
    if len(seeds) > 1:
        each = f"{seeds[0]} to {seeds[-1]} seeds per {unit}"
    if header in ("run", "rope_scaling"):
        return f"{_plural(runs, 'run')} of one config: {_plural(runs, 'seed')}."
    what = _plural(len(groups), unit)
    of = "of the keys" if header == "runs" else f"of {header}"
    return f"{_plural(runs, 'run')}: {what} {of}, {each}."


def _unknown_note(results: list[RunResult]) -> list[str]:
    """Say so when the prompt held characters the runs' vocabulary lacks (they became <unk>)."""
    unknown = max(r.prompt_unknown for r in results)
    if not unknown:
        return []
    return [
        f"{_plural(unknown, 'character')} of the prompt "
        f"{'is' if unknown == 1 else 'are'} not in the runs' vocabulary and became `<unk>`: "
        "the continuations start from that. Pass `--prompt` with text from the corpus.",
        "",
    ]


def write_report(
    results: list[RunResult], out_dir: str | Path, prompt: str, max_new_tokens: int
) -> str:
    """Write ``report.md``, ``report.json`` and the :data:`PICTURES` into ``out_dir``; return
    the Markdown. ``max_new_tokens`` is the continuations' length limit, as the table says."""
    markdown, numbers = render(results, prompt, max_new_tokens)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _draw(_grouped(results), out_dir)
    (out_dir / "report.md").write_text(markdown, encoding="utf-8")
    (out_dir / "report.json").write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
    return markdown
