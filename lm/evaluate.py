"""Validation loss and perplexity over a whole split, at the trained context length or others.

Evaluating at contexts longer than the model was trained on is how position schemes differ
most: RoPE, ALiBi, sinusoids and NoPE run at any length (with more or less success); a learned
table has no vector past its last trained position, which is reported instead of guessed.
A RoPE model can also be evaluated with another context extension than it was trained with
(PI, NTK-aware, YaRN: :func:`load_with_rope_scaling`), the same weights, no retraining.

Lengths are whole numbers of tokens or multiples of the trained context (``2x``). At each one
the split is read in non-overlapping windows of that length, every token a target once; the
rows say how many windows that was and when none reaches the length (a split shorter than it).

A run trained on a generated task (``builtin:copy``, ``counting``, ``mqar``... see
:mod:`lm.data.tasks`) is also asked for exact answers at every evaluation length, in each of
the task's splits (:func:`task_accuracy`): whether it does the task at lengths and settings it
never saw, which its loss alone does not say. A passkey run is asked on a grid of lengths, up to
past its context, by depths of the key (:func:`passkey_accuracy`), and its ``k_max`` is Position
Interpolation's (Chen et al. 2023, arXiv 2306.15595, section 3.2: :func:`k_max`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from lm.config.errors import FLAGS, LMError
from lm.config.names import SPLITS, XPOS_REACH, extends, readers, task_of
from lm.config.sections import Config, DataConfig, ModelConfig
from lm.config.tasks import passkey_lengths
from lm.config.values import parse_context_lengths, parse_rope_scaling
from lm.data.batches import eval_batches, eval_windows, model_inputs
from lm.data.sources import TokenizedSplit, prepare_data
from lm.data.tasks import TaskSettings, evaluation_examples, splits
from lm.model.schemes.rope import xpos_reach
from lm.model.transformer import TransformerLM, loss_sum
from lm.runs.code import read_run_config
from lm.runs.directory import TOKENIZER
from lm.runs.load import LoadedRun, load_run
from lm.runtime.device import seeded_draws
from lm.runtime.distributed import World, all_reduce_sum
from lm.sample import generate

EVAL_FILE = "eval.json"
PASSKEY_SUCCESS = 0.2
"""PI's k_max counts a length as retrieved when at least this share of its passkeys are."""


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    split: TokenizedSplit,
    data: DataConfig,
    context_length: int,
    batch_size: int,
    pad_id: int,
    device: torch.device,
    autocast: contextlib.AbstractContextManager | None = None,
    max_batches: int | None = None,
    world: World | None = None,
    draws: tuple | None = None,
) -> tuple[float, int]:
    """Mean next-token loss over the split (every target once) and the number of targets.
    ``draws``: the key (:func:`eval_draws`) that seeds, with each batch's index, the positions
    a model drawing them at evaluation reads."""
    world = world or World()
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (loss sum, target count)
    batches: Iterator = eval_batches(
        split, data, context_length, batch_size, pad_id, max_batches, world.rank, world.size
    )
    for i, batch in enumerate(batches):
        b = model_inputs(batch, device)
        seeded = seeded_draws(device, *draws, world.rank, i) if draws else contextlib.nullcontext()
        with autocast or contextlib.nullcontext(), seeded:
            logits = model(**b["inputs"])
        total[0] += loss_sum(logits, b["targets"], b["loss_mask"]).double()
        total[1] += batch["loss_mask"].sum().item()
    all_reduce_sum(world, total)
    model.train(was_training)
    count = int(total[1].item())
    return (total[0].item() / count if count else float("nan")), count


def eval_draws(config: Config, split: str, length: int) -> tuple | None:
    """The key that seeds the positions a run drawing them at evaluation
    (``model.random_positions_eval``) reads on ``split`` at ``length``: its ``train.seed``, the
    split and the length, so that an evaluation is a function of the run. None: nothing drawn."""
    return (config.train.seed, split, length) if config.model.random_positions_eval else None


def length_specs(lengths: str | int | Sequence[str | int]) -> list[str]:
    """Evaluation lengths as the Python API takes them: text as ``--context-lengths`` reads it
    (``"1x,2x"``), one whole number of tokens, or a list of both; checked by
    :func:`parse_context_lengths`, as the flag is, with an LMError naming ``lengths``."""
    items = [lengths] if isinstance(lengths, (str, int)) else lengths
    if not isinstance(items, (list, tuple)):
        raise LMError(f"lengths: {lengths!r} is not a length or a list of lengths ('1x', 256)")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise LMError(
                f"lengths: {item!r} is not a length: a whole number of tokens (e.g. 256) or a "
                "multiple of the trained context (e.g. '2x')"
            )
    try:
        return parse_context_lengths(",".join(str(item) for item in items))
    except ValueError as e:
        raise LMError(f"lengths: {e}") from None


def resolve_length(spec: str | int, trained: int) -> int:
    """A length spec (``"2x"``, ``"1.5x"``, ``"256"`` or an int) in tokens, for a model trained
    at ``trained``."""
    text = str(spec)
    if not text.endswith("x"):
        return int(text)
    tokens = round(float(text[:-1]) * trained)
    if tokens < 2:
        raise LMError(f"evaluation length {text} of a {trained}-token context is under 2 tokens")
    return tokens


def load_with_rope_scaling(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    device: str = "cpu",
    rope_scaling: str | None = None,
    names: dict[str, str] = FLAGS,
) -> LoadedRun:
    """A run's model as trained, or with another RoPE context extension at evaluation time
    (``rope_scaling`` ``none``, ``pi:S``, ``ntk:S`` or ``yarn:S`` replaces the run's
    ``model.rope_scaling``; YaRN's L stays the run's trained context). Same weights either way.
    ``names``: how an error names ``checkpoint`` and ``rope_scaling`` (their flags, or
    ``lm.config.errors.ARGUMENTS``)."""
    if rope_scaling is not None:  # before any loading
        method, _ = parse_rope_scaling(rope_scaling, names["rope_scaling"])
    run = load_run(run_dir, checkpoint, device, names["checkpoint"])
    if rope_scaling is None:
        return run
    model = run.config.model
    if not extends(model.layer_positions):
        raise LMError(
            f"{run_dir}: {names['rope_scaling']} {rope_scaling} extends RoPE; this run uses "
            f"position: {model.position_text} ({' and '.join(readers('rope_scaling'))} rotate "
            "by RoPE's angles)"
        )
    value = None if method == "none" else rope_scaling.strip()
    model = dataclasses.replace(model, rope_scaling=value)
    extended = TransformerLM(model)
    extended.load_state_dict(run.model.state_dict())
    config = run.config.replace(model=model)
    return dataclasses.replace(run, config=config, model=extended.to(device).eval())


def evaluate_lengths(
    run: LoadedRun,
    run_dir: str | Path,
    lengths: list[str | int] | None = None,
    split: str = "val",
    batch_size: int | None = None,
    device: str = "cpu",
    max_batches: int | None = None,
) -> list[dict[str, Any]]:
    """Loss and perplexity of a loaded run at each length (default: the trained context), with
    what was read: ``windows`` (how many) and ``window`` (the longest, in tokens); a ``note``
    says when no window reaches the length, or why a length has no loss."""
    if split not in SPLITS:
        raise LMError(f"split: {split!r} is not one of {', '.join(SPLITS)}")
    cfg = run.config
    # The run's own data, from the cache its training made (silently: only the table matters).
    prepared = prepare_data(cfg.data, tokenizer_path=Path(run_dir) / TOKENIZER, log=None)
    data = prepared.val if split == "val" else prepared.train
    batch_size = batch_size or cfg.train.eval_batch()
    pad_id = prepared.tokenizer.pad_id
    return [
        _length_row(run, data, pad_id, split, spec, batch_size, device, max_batches)
        for spec in lengths or ["1x"]
    ]


def _length_row(
    run: LoadedRun,
    data: TokenizedSplit,
    pad_id: int,
    split: str,
    spec: str | int,
    batch_size: int,
    device: str,
    max_batches: int | None,
) -> dict[str, Any]:
    """:func:`evaluate_lengths`' row for one length: the loss over the ``split`` split's
    windows of that length, in batches of ``batch_size`` rows at the trained context."""
    cfg, trained = run.config, run.config.model.context_length
    length = resolve_length(spec, trained)
    row = {"context_length": length, "requested": str(spec), "trained_context": trained}
    if note := _out_of_reach(cfg.model, length):
        return {**row, "loss": None, "perplexity": None, "note": note}
    batch = max(1, batch_size * trained // length)  # about as many tokens a batch at any length
    _, sizes = eval_windows(data, cfg.data, length)
    if max_batches is not None:
        sizes = sizes[: max_batches * batch]
    windows, longest = len(sizes), int(sizes.max()) - 1 if len(sizes) else 0
    loss, count = evaluate(
        run.model, data, cfg.data, length, batch, pad_id, torch.device(device),
        max_batches=max_batches, draws=eval_draws(cfg, split, length),
    )  # fmt: skip
    perplexity = math.exp(min(loss, 50.0))
    row.update(loss=loss, perplexity=perplexity, tokens=count, windows=windows, window=longest)
    if longest < length and is_task(cfg):  # examples, not windows of a text
        row["note"] = (
            f"the loss of the answers of {windows} {split} examples, each read whole (at "
            f"most {longest} tokens); what a task measures by length is its accuracy"
        )
    elif longest < length:
        row["note"] = (
            f"no window of the {split} split reaches {length} tokens: {windows} window(s), "
            f"the longest {longest}"
        )
    return row


def _out_of_reach(model: ModelConfig, length: int) -> str:
    """Why a model has no loss at ``length``, or '': a learned table has no vector past its
    rows; positions drawn at evaluation are distinct draws from ``[0, M)``, so at most M;
    xPos's scales leave fp32 past the reach its ``xpos_scale_base`` B sets
    (``lm.model.schemes.rope.xpos_reach``), for any scheme that reads B."""
    if any(r.table for r in model.rows) and length > model.position_range:
        return f"learned positions stop at {model.position_range}: no vector for longer contexts"
    if model.random_positions_eval and length > model.random_positions:
        return (
            f"model.random_positions_eval draws {length} distinct positions from "
            f"[0, {model.random_positions}): there are not that many"
        )
    reach = xpos_reach(model.xpos_scale_base)
    if readers("xpos_scale_base", model.layer_positions) and length > reach:
        return (
            f"xPos with xpos_scale_base {model.xpos_scale_base:g} computes positions up to "
            f"{reach} ({XPOS_REACH} B): its scales leave fp32 beyond"
        )
    return ""


def evaluate_run(
    run_dir: str | Path,
    context_lengths: list[str | int] | None = None,
    split: str = "val",
    checkpoint: str | Path | None = None,
    batch_size: int | None = None,
    device: str = "cpu",
    max_batches: int | None = None,
    rope_scaling: str | None = None,
) -> dict[str, Any]:
    """``lm eval``: :func:`evaluate_lengths` of a run's model (with ``rope_scaling`` at
    evaluation time, if given), and for a generated task its :func:`task_accuracy`; what
    ``eval.json`` holds: ``rows`` (losses) and ``accuracy`` (a task's, else None)."""
    run = load_with_rope_scaling(run_dir, checkpoint, device, rope_scaling)
    rows = evaluate_lengths(run, run_dir, context_lengths, split, batch_size, device, max_batches)
    result = {
        "step": run.step,
        "split": split,
        "checkpoint": str(run.checkpoint),
        "rope_scaling": run.config.model.rope_scaling,
        "rows": rows,
        "accuracy": task_accuracy(run, device, batch_size) if is_task(run.config) else None,
    }
    if task_of(run.config.data.source) == "passkey":
        result["k_max"] = k_max(result["accuracy"])
    path = eval_path(run_dir, rope_scaling)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def eval_path(run_dir: str | Path, rope_scaling: str | None = None) -> Path:
    """Where ``lm eval`` keeps its result, one per setting: ``eval.json`` for the model as
    trained, ``eval.<method>_<factor>.json`` (``eval.ntk_4.json``; ``eval.none.json`` removing
    a trained extension) with another RoPE extension at evaluation time."""
    run_dir = Path(run_dir)
    if rope_scaling is None:
        return run_dir / EVAL_FILE
    method, factor = parse_rope_scaling(rope_scaling, "--rope-scaling")
    own = parse_rope_scaling(read_run_config(run_dir).model.rope_scaling)
    if (method, factor) == own or factor == own[1] == 1.0:  # the model as trained
        return run_dir / EVAL_FILE
    return run_dir / ("eval.none.json" if factor == 1.0 else f"eval.{method}_{factor:g}.json")


def setting_line(run_dir: str | Path, rope_scaling: str) -> str:
    """The line above ``lm eval``'s table that names the RoPE extension it measured."""
    own = read_run_config(Path(run_dir)).model.rope_scaling or "none"
    path = eval_path(run_dir, rope_scaling)
    if path.name == EVAL_FILE:
        return f"rope_scaling {rope_scaling}: the run as trained ({path})"
    return f"rope_scaling {rope_scaling} at evaluation time, in place of the trained {own} ({path})"


def is_task(config: Config) -> bool:
    """Whether a run trained on a generated task (``builtin:copy`` ...)."""
    return task_of(config.data.source) is not None


@torch.no_grad()
def task_accuracy(
    run: LoadedRun, device: str = "cpu", batch_size: int | None = None
) -> list[dict[str, Any]]:
    """Exact-match accuracy of a task run at each of ``data.task_eval_lengths``: the answers it
    gives greedily (``lm.sample.generate``, KV cache) to ``data.task_eval_examples`` prompts per
    length, each right only if every token and the end of the document are. One row per length
    (per split and length for a task asked in splits, ``lm.data.tasks.splits``): ``length``,
    ``accuracy``, ``correct``, ``examples``, ``trained`` (a training length, and for a split
    task the training split), and for a split task ``split``. With
    ``model.random_positions_eval`` the positions are drawn afresh at every decoding pass, from
    the run's ``train.seed``, the batch's prompts and the pass (``lm.sample.generate``)."""
    data = run.config.data
    task = task_of(data.source)
    if task == "passkey":
        return passkey_accuracy(run, device, batch_size)
    trained, lengths = data.task_ranges()
    tok = run.tokenizer
    size = batch_size or run.config.train.eval_batch()
    seed = run.config.train.seed  # greedy: it seeds only positions drawn at evaluation
    rows = []
    for index, (split, settings) in enumerate(splits(task, TaskSettings.of(data))):
        for length in lengths:
            count = data.task_eval_examples
            pairs = evaluation_examples(task, length, count, data.seed, settings, index)
            prompts = [tok.encode(p) for p, _ in pairs]
            answers = [tok.encode(a) for _, a in pairs]
            correct = 0
            for i in range(0, len(pairs), size):
                want = answers[i : i + size]
                longest = max(map(len, want)) + 1  # the answer, then <eod>
                batch = prompts[i : i + size]
                got = generate(run.model, batch, longest, tok.pad_id, tok.eod_id, seed=seed)
                correct += sum(g == w for g, w in zip(got, want, strict=True))
            row = {"split": split} if split is not None else {}
            rows.append(
                {
                    **row,
                    "length": length,
                    "accuracy": correct / len(pairs),
                    "correct": correct,
                    "examples": len(pairs),
                    "trained": length in trained and index == 0,
                }
            )
    return rows


@torch.no_grad()
def passkey_accuracy(
    run: LoadedRun, device: str = "cpu", batch_size: int | None = None
) -> list[dict[str, Any]]:
    """A passkey run's exact-match accuracy on the grid of ``data.passkey_lengths`` (up to past
    its context) by ``data.passkey_depths`` evenly spaced depths, ``data.task_eval_examples``
    prompts per cell. One row per length: ``length``, ``accuracy`` (the mean over depths),
    ``correct``, ``examples``, ``trained``, and ``depths``, a row per depth (``depth`` from 0
    to 1, ``accuracy``, ``correct``, ``examples``). A length no model of the run can read has
    accuracy None and a ``note`` (:func:`_out_of_reach`)."""
    cfg = run.config
    count, trained = cfg.data.task_eval_examples, cfg.model.context_length
    n, lengths = cfg.data.passkey_depths, cfg.data.task_ranges()[0]
    rows = []
    for length in passkey_lengths(cfg.data, trained):
        note = _out_of_reach(cfg.model, length)
        cells = []
        for i in range(n):
            # About the same number of tokens per batch at every length.
            size = max(1, (batch_size or cfg.train.eval_batch()) * trained // length)
            correct = None if note else _passkeys_retrieved(run, length, i, size, device)
            right = None if correct is None else correct / count
            cells.append(
                {"depth": i / (n - 1), "accuracy": right, "correct": correct, "examples": count}
            )
        row = {"length": length, "accuracy": None, "correct": None, "examples": count * n}
        if not note:
            row.update(
                accuracy=sum(c["accuracy"] for c in cells) / n,
                correct=sum(c["correct"] for c in cells),
            )
        rows.append({**row, "trained": length in lengths, "depths": cells})
        if note:
            rows[-1]["note"] = note
    return rows


def _passkeys_retrieved(run: LoadedRun, length: int, depth: int, size: int, device: str) -> int:
    """How many of the cell's prompts (``depth``: the index of its depth) the model answers with
    all 5 digits of the key. One forward over prompt and answer: the greedy answer is right
    exactly when every digit is the likeliest after the right ones before it, and the whole
    prompt is read, however far past the context (``lm.sample.generate`` would keep its last
    ``model.context_length`` tokens)."""
    cfg = run.config
    n = cfg.data.passkey_depths
    settings = dataclasses.replace(TaskSettings.of(cfg.data), depth=depth / (n - 1))
    count = cfg.data.task_eval_examples
    pairs = evaluation_examples("passkey", length, count, cfg.data.seed, settings, depth)
    ids = torch.tensor([run.tokenizer.encode(p + a) for p, a in pairs], device=device)
    start = len(pairs[0][0])  # every prompt of a length is as long: the key has 5 digits
    correct = 0
    for b in range(0, count, size):
        key = (cfg.train.seed, "passkey", length, depth, b)
        seeded = seeded_draws(torch.device(device), *key)
        with seeded if cfg.model.random_positions_eval else contextlib.nullcontext():
            logits = run.model(ids[b : b + size])  # (B, length, vocab)
        said = logits[:, start - 1 : length - 1].argmax(-1)
        correct += int((said == ids[b : b + size, start:]).all(-1).sum())
    return correct


def k_max(rows: list[dict[str, Any]], success: float = PASSKEY_SUCCESS) -> int | None:
    """Position Interpolation's k_max over passkey rows (their ``length`` and ``accuracy``,
    the mean over depths, as PI's keys stand at uniformly drawn depths): the longest length at
    which it and every shorter one asked retrieve at least ``success`` of their keys; None when
    the shortest does not. A length with no accuracy (out of reach) ends it too."""
    longest = None
    for row in sorted(rows, key=lambda r: r["length"]):
        if row["accuracy"] is None or row["accuracy"] < success:
            break
        longest = row["length"]
    return longest


def format_passkey(rows: list[dict[str, Any]]) -> str:
    """A passkey grid as a Markdown table (rows lengths, columns depths, then their mean) and
    its k_max."""
    depths = [c["depth"] for c in rows[0]["depths"]]
    lines = [
        "| length | " + " | ".join(f"depth {d:.0%}" for d in depths) + " | mean | trained |",
        "|---:|" + "---:|" * (len(depths) + 1) + ":---:|",
    ]
    for r in rows:
        cells = ["n/a" if c["accuracy"] is None else f"{c['accuracy']:.0%}" for c in r["depths"]]
        mean = "n/a" if r["accuracy"] is None else f"{r['accuracy']:.1%}"
        mark = "yes" if r["trained"] else ""
        lines.append(f"| {r['length']} | {' | '.join(cells)} | {mean} | {mark} |")
    notes = [f"{r['length']}: {r['note']}" for r in rows if r.get("note")]
    found = k_max(rows)
    lines += [
        "",
        f"k_max: {found if found is not None else 'none'} (the longest length at which it and "
        f"every shorter one retrieve at least {PASSKEY_SUCCESS:.0%} of the keys, over all "
        f"depths; {rows[0]['examples'] // len(depths)} keys per cell)",
        *notes,
    ]
    return "\n".join(lines)


def format_accuracy(rows: list[dict[str, Any]]) -> str:
    """A task's accuracy rows as a Markdown table; trained lengths marked (and a split task's
    splits named; a passkey grid by :func:`format_passkey`)."""
    if "depths" in rows[0]:
        return format_passkey(rows)
    split = "split" in rows[0]
    head = "| split " if split else ""
    lines = [
        f"{head}| length | exact match | correct | trained |",
        ("|---" if split else "") + "|---:|---:|---:|:---:|",
    ]
    for r in rows:
        mark = "yes" if r["trained"] else ""
        cell = f"| {r['split']} " if split else ""
        lines.append(
            f"{cell}| {r['length']} | {r['accuracy']:.1%} | {r['correct']}/{r['examples']} "
            f"| {mark} |"
        )
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| context | loss | perplexity | targets | windows |", "|---:|---:|---:|---:|---:|"]
    notes = []
    for r in rows:
        if r["loss"] is None:
            lines.append(f"| {r['context_length']} | n/a | n/a | | |")
        else:
            lines.append(
                f"| {r['context_length']} | {r['loss']:.4f} | {r['perplexity']:.2f} "
                f"| {r['tokens']} | {r['windows']} |"
            )
        if r.get("note"):
            notes.append(f"{r['context_length']}: {r['note']}")
    return "\n".join([*lines, "", *notes] if notes else lines)
