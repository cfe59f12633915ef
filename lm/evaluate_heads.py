"""What each attention head reads, and how much the model learns in context (``lm heads``).

After Olsson et al. 2022, "In-context Learning and Induction Heads" (arXiv 2209.11895): an
induction head (``[A][B] ... [A] -> [B]``) reads the token after the earlier copy of the current
one, which needs a previous-token head below it, which needs position. The per-head patterns
follow TransformerLens's head detector (``transformer_lens/head_detector.py``: its
``previous_token_head``, ``duplicate_token_head`` and ``induction_head`` patterns, scored by its
``mul`` measure, the share of a query's weight on the pattern's keys); docs/heads.md says where
these differ from it.

The probe (:func:`probe`) is a function of the run: ``B`` sequences, each ``n`` random ordinary
tokens (no ``<pad>``, ``<eod>`` or ``<unk>``, no token twice) written twice, drawn from the run's
``train.seed`` by a generator of its own. Every query ``i >= n`` of the second copy then has
exactly one earlier copy, at ``i - n``. Per layer and head, averaged over the sequences:

* ``previous_token``: ``A[i, i-1]`` over queries ``1 .. 2n-1``;
* ``induction`` (Olsson's prefix matching): ``A[i, i-n+1]``, the token after the earlier copy,
  over the second copy's queries;
* ``duplicate_token``: ``A[i, i-n]``, the earlier copy itself, over the same queries;
* ``first_token``: ``A[i, 0]`` over queries ``1 .. 2n-1`` (an attention sink reads it).

The weights are the notes' ``A`` through the explicit kernel
(``TransformerLM.attention_weights``), whatever kernel the run trained with. The model-level
``icl_score`` (:func:`icl_score`) is Olsson's in-context learning score scaled to the run's
context: the mean validation loss in the last tenth of positions minus that in a band as wide
around the tenth position; negative when later tokens are predicted better.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lm.config.errors import LMError
from lm.config.sections import Config
from lm.config.values import whole_number
from lm.data.batches import eval_batches, model_inputs
from lm.data.sources import TokenizedSplit, prepare_data
from lm.data.tokenizer import TextTokenizer
from lm.model.transformer import TransformerLM
from lm.runs.checkpoint import complete_checkpoints
from lm.runs.directory import CONFIG, TOKENIZER
from lm.runs.load import load_run
from lm.runtime.device import seeded_draws
from lm.runtime.distributed import World, all_reduce_sum

SCORES = ("previous_token", "induction", "duplicate_token", "first_token")
PROBE_SEQUENCES = 4
"""Sequences in the probe: few, so that scoring at every evaluation costs little."""
ICL_WINDOWS = 16
"""Validation windows the in-context learning score reads (the first ones, as evaluation does)."""
DECIMALS = 4


def probe(tokenizer: TextTokenizer, context_length: int, seed: int) -> torch.Tensor:
    """The probe, ``[PROBE_SEQUENCES, 2n]`` token ids: each row ``n`` distinct ordinary tokens
    twice, ``n = min(context_length // 2, ordinary tokens)``; drawn from ``seed`` by a generator
    of its own, so that no global random stream moves."""
    specials = {tokenizer.pad_id, tokenizer.eod_id, tokenizer.unk_id}
    ordinary = torch.tensor([i for i in range(tokenizer.vocab_size) if i not in specials])
    n = min(context_length // 2, len(ordinary))
    if n < 2:
        raise LMError(
            f"head scores need a probe of two tokens written twice; this run has "
            f"{len(ordinary)} ordinary tokens and a {context_length}-token context"
        )
    generator = torch.Generator().manual_seed(seed)
    rows = [
        ordinary[torch.randperm(len(ordinary), generator=generator)[:n]]
        for _ in range(PROBE_SEQUENCES)
    ]
    return torch.stack([torch.cat([row, row]) for row in rows])


def pattern_scores(weights: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """Each head's scores from its weights over probe sequences of ``n`` tokens twice,
    ``[B, H, 2n, 2n]`` (rows queries, columns keys): ``{score: [H]}``, means over the sequences
    and the queries each score reads (module docstring)."""
    queries = torch.arange(1, 2 * n, device=weights.device)  # every query with a key before it
    second = torch.arange(n, 2 * n, device=weights.device)  # the queries with an earlier copy
    return {
        "previous_token": weights[..., queries, queries - 1].mean((0, -1)),
        "induction": weights[..., second, second - n + 1].mean((0, -1)),
        "duplicate_token": weights[..., second, second - n].mean((0, -1)),
        "first_token": weights[..., queries, 0].mean((0, -1)),
    }


@torch.no_grad()
def head_scores(model: TransformerLM, ids: torch.Tensor, seed: int) -> dict[str, list]:
    """``{score: [layer][head]}`` of ``model`` on the probe ``ids`` (:func:`probe`), one
    sequence per forward so that only one sequence's maps are held at a time. Positions a model
    draws at evaluation are drawn from ``seed``; the global random streams are left as they
    were."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    n = ids.shape[1] // 2
    total: dict[str, torch.Tensor] = {}
    for i, row in enumerate(ids):
        with seeded_draws(device, seed, "heads", i):
            layers = model.attention_weights(row[None].to(device))
        for name, value in _stack([pattern_scores(w.float(), n) for _, w in layers]).items():
            total[name] = total.get(name, 0) + value
    model.train(was_training)
    return {
        name: [[round(v / len(ids), DECIMALS) for v in layer] for layer in total[name].tolist()]
        for name in SCORES
    }


def _stack(layers: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-layer ``{score: [H]}`` as ``{score: [layers, H]}``."""
    return {name: torch.stack([layer[name] for layer in layers]) for name in SCORES}


def icl_bands(context_length: int) -> tuple[range, range]:
    """The early and late positions (of the predicted token's input, 0-based) the in-context
    learning score compares: the last ``w = max(1, T // 10)`` positions, and ``w`` positions
    centred on position ``T // 10``."""
    w = max(1, context_length // 10)
    start = max(0, context_length // 10 - w // 2)
    return range(start, start + w), range(context_length - w, context_length)


@torch.no_grad()
def icl_score(
    model: torch.nn.Module,
    config: Config,
    split: TokenizedSplit,
    pad_id: int,
    device: torch.device,
    autocast: contextlib.AbstractContextManager | None = None,
    world: World | None = None,
) -> float | None:
    """Olsson's in-context learning score at the run's context ``T``: over the first
    :data:`ICL_WINDOWS` validation windows, the mean next-token loss at the late band of
    positions minus that at the early band (:func:`icl_bands`), real targets only. None where a
    band has no target (windows or a task's answers shorter than the context)."""
    world = world or World()
    T, size = config.model.context_length, min(config.train.eval_batch(), ICL_WINDOWS)
    sums = torch.zeros(2, T, dtype=torch.float64, device=device)  # (loss sum, targets) by position
    was_training = model.training
    model.eval()
    batches = eval_batches(
        split, config.data, T, size, pad_id, -(-ICL_WINDOWS // size), world.rank, world.size
    )
    for i, batch in enumerate(batches):
        b = model_inputs(batch, device)
        drawn = seeded_draws(device, config.train.seed, "icl", world.rank, i)
        with autocast or contextlib.nullcontext(), drawn:
            logits = model(**b["inputs"])
        mask = batch["loss_mask"].to(device)
        for r in range(logits.shape[0]):  # a row at a time: no fp32 copy of the whole batch
            loss = F.cross_entropy(logits[r].float(), b["targets"][r], reduction="none")
            length = loss.shape[0]
            sums[0, :length] += torch.where(mask[r], loss, 0.0).double()
            sums[1, :length] += mask[r].double()
    model.train(was_training)
    all_reduce_sum(world, sums)
    early, late = (sums[:, band.start : band.stop].sum(1).tolist() for band in icl_bands(T))
    if early[1] == 0 or late[1] == 0:
        return None
    return round(late[0] / late[1] - early[0] / early[1], DECIMALS)


def evaluation_record(
    model: TransformerLM,
    eval_model: torch.nn.Module,
    config: Config,
    tokenizer: TextTokenizer,
    split: TokenizedSplit,
    device: torch.device,
    autocast: contextlib.AbstractContextManager | None = None,
    world: World | None = None,
) -> dict[str, Any]:
    """What an evaluation during training adds to its metrics.jsonl line: ``icl_score`` and
    ``heads`` ({score: [layer][head]}). Every process measures (a sharded model gathers its
    weights in each forward); ``eval_model`` (compiled or wrapped, as evaluation runs it) reads
    the windows, ``model`` (the plain module) the probe."""
    ids = probe(tokenizer, config.model.context_length, config.train.seed)
    icl = icl_score(eval_model, config, split, tokenizer.pad_id, device, autocast, world)
    return {"icl_score": icl, "heads": head_scores(model, ids, config.train.seed)}


def checkpoint_at(run_dir: Path, step: int | None, name: str) -> Path | None:
    """The checkpoint of ``step`` (None: the newest, as loading chooses), or an LMError that
    lists the steps the run has."""
    if step is None:
        return None
    whole_number(step, 0, name)
    found = {int(p.name.rsplit("_", 1)[1]): p for p in complete_checkpoints(run_dir)}
    if step not in found:
        have = ", ".join(map(str, found)) or "none yet"
        raise LMError(f"{run_dir}: {name} {step}: no checkpoint at that step (steps: {have})")
    return found[step]


def heads_of_run(
    run_dir: str | Path, step: int | None = None, device: str = "cpu", name: str = "--step"
) -> dict[str, Any]:
    """``lm heads``: the scores of a run's newest checkpoint or the one at ``step`` (``name``:
    how an error names it), as docs/heads.md's schema: ``step``, ``checkpoint``, ``probe``,
    ``scores`` ({score: [layer][head]}), ``icl_score`` and its ``icl`` bands."""
    run_dir = Path(run_dir)
    at = checkpoint_at(run_dir, step, name) if (run_dir / CONFIG).is_file() else None
    run = load_run(run_dir, at, device)
    config, tok = run.config, run.tokenizer
    ids = probe(tok, config.model.context_length, config.train.seed)
    prepared = prepare_data(config.data, tokenizer_path=run_dir / TOKENIZER, log=None)
    where = torch.device(device)
    icl = icl_score(run.model, config, prepared.val, tok.pad_id, where)
    early, late = icl_bands(config.model.context_length)
    return {
        "step": run.step,
        "checkpoint": str(run.checkpoint),
        "probe": {"sequences": ids.shape[0], "copy": ids.shape[1] // 2, "seed": config.train.seed},
        "scores": head_scores(run.model, ids, config.train.seed),
        "icl_score": icl,
        "icl": {"early": [early.start, early.stop], "late": [late.start, late.stop],
                "windows": ICL_WINDOWS},
    }  # fmt: skip


def format_heads(result: dict[str, Any]) -> str:
    """``lm heads``'s table: one row per layer and head, a column per score; the probe above it
    and the in-context learning score below."""
    probe_, scores = result["probe"], result["scores"]
    lines = [
        f"step {result['step']} ({result['checkpoint']}); probe: {probe_['sequences']} "
        f"sequences of {probe_['copy']} random tokens written twice (seed {probe_['seed']})",
        "",
        "| layer | head | previous token | induction | duplicate token | first token |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for layer, heads in enumerate(scores[SCORES[0]]):
        for head in range(len(heads)):
            cells = " | ".join(f"{scores[s][layer][head]:.3f}" for s in SCORES)
            lines.append(f"| {layer} | {head} | {cells} |")
    icl, (e0, e1), (l0, l1) = result["icl_score"], result["icl"]["early"], result["icl"]["late"]
    said = "n/a (a band has no validation target)" if icl is None else f"{icl:+.4f}"
    lines += [
        "",
        f"in-context learning score: {said} (mean validation loss at positions {l0}-{l1 - 1} "
        f"minus at {e0}-{e1 - 1}, first {result['icl']['windows']} windows)",
    ]
    return "\n".join(lines)
