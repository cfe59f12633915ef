"""Validation loss and perplexity over a whole split, at the trained context length or others.

Evaluating at contexts longer than the model was trained on is how position schemes differ
most: RoPE, ALiBi, sinusoids and NoPE run at any length (with more or less success); a learned
table has no vector past its last trained position, which is reported instead of guessed.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from lm.batches import eval_batches
from lm.config import DataConfig
from lm.data import TokenizedSplit, prepare_data
from lm.distributed import World, all_reduce_sum
from lm.model import loss_sum
from lm.runs import TOKENIZER, load_run

EVAL_FILE = "eval.json"


def model_inputs(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, Any]:
    """Move a batch to ``device`` and keep only the masks the model needs.

    The key mask is dropped, so the model takes the fused causal kernel with no mask tensor,
    when it is all True or when every row's padding is on the right and no document mask
    applies: the causal mask already hides trailing pads from every real query, the pads carry
    no loss, and the positions ``0..T-1`` the model then uses count the real tokens of each row
    exactly. The check reads the host batch before the copy and never waits for the device.
    """
    if device.type == "cuda":  # pinned host memory: the copy overlaps with the previous step
        moved = {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    else:
        moved = {k: v.to(device) for k, v in batch.items()}
    inputs: dict[str, Any] = {"input_ids": moved["input_ids"]}
    if "segment_ids" in batch or not _right_padded(batch["key_mask"]):
        inputs["key_mask"] = moved["key_mask"]
    if "segment_ids" in moved:
        inputs["segment_ids"] = moved["segment_ids"]
    loss_mask = None if bool(batch["loss_mask"].all()) else moved["loss_mask"]
    return {"inputs": inputs, "targets": moved["targets"], "loss_mask": loss_mask}


def _right_padded(key_mask: torch.Tensor) -> bool:
    """True when no real token follows a pad in any row of ``key_mask [B, T]`` (host tensor);
    an all-True mask counts."""
    return bool((key_mask[:, 1:] <= key_mask[:, :-1]).all())


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
) -> tuple[float, int]:
    """Mean next-token loss over the split (every target once) and the number of targets."""
    world = world or World()
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # (loss sum, target count)
    batches: Iterator = eval_batches(
        split, data, context_length, batch_size, pad_id, max_batches, world.rank, world.size
    )
    for batch in batches:
        b = model_inputs(batch, device)
        with autocast or contextlib.nullcontext():
            logits = model(**b["inputs"])
        total[0] += loss_sum(logits, b["targets"], b["loss_mask"]).double()
        total[1] += batch["loss_mask"].sum().item()
    all_reduce_sum(world, total)
    model.train(was_training)
    count = int(total[1].item())
    return (total[0].item() / count if count else float("nan")), count


def evaluate_run(
    run_dir: str | Path,
    context_lengths: list[int] | None = None,
    split: str = "val",
    checkpoint: str | Path | None = None,
    batch_size: int | None = None,
    device: str = "cpu",
    max_batches: int | None = None,
) -> list[dict[str, Any]]:
    """Loss and perplexity of a run's model at each context length; written to ``eval.json``."""
    run = load_run(run_dir, checkpoint, device)
    cfg = run.config
    trained = cfg.model.context_length
    lengths = context_lengths or [trained]
    # The run's own data, from the cache its training made (silently: only the table matters).
    prepared = prepare_data(cfg.data, tokenizer_path=Path(run_dir) / TOKENIZER, log=None)
    data_split = prepared.val if split == "val" else prepared.train
    base_batch = batch_size or cfg.train.eval_batch()
    rows = []
    for length in lengths:
        row: dict[str, Any] = {"context_length": length, "trained_context": trained}
        if cfg.model.position == "learned" and length > trained:
            row.update(
                loss=None,
                perplexity=None,
                note=f"learned positions stop at {trained}: no vector for longer contexts",
            )
            rows.append(row)
            continue
        # About the same number of tokens per batch at every length.
        bs = max(1, base_batch * trained // length)
        loss, count = evaluate(
            run.model,
            data_split,
            cfg.data,
            length,
            bs,
            prepared.tokenizer.pad_id,
            torch.device(device),
            max_batches=max_batches,
        )
        row.update(loss=loss, perplexity=math.exp(min(loss, 50.0)), tokens=count)
        rows.append(row)
    result = {"step": run.step, "split": split, "checkpoint": str(run.checkpoint), "rows": rows}
    (Path(run_dir) / EVAL_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| context | loss | perplexity | targets |", "|---:|---:|---:|---:|"]
    for r in rows:
        if r["loss"] is None:
            lines.append(f"| {r['context_length']} | n/a | n/a | {r['note']} |")
        else:
            lines.append(
                f"| {r['context_length']} | {r['loss']:.4f} | {r['perplexity']:.2f} "
                f"| {r['tokens']} |"
            )
    return "\n".join(lines)
