"""Token ids -> batches, one format for both modes (the notes' padding masks).

Every batch is a dict of ``input_ids``, ``targets``, ``key_mask`` (True at real input tokens:
padded keys never supply values to real queries) and ``loss_mask`` (True where the target is
real: padded targets add no loss; for a generated task, only its answers' tokens count), plus
``segment_ids`` for packed windows with document masks.
``packed`` draws random windows from the token stream; ``padded`` trains on one document (chunk)
per row, grouped by length. :class:`TrainBatches` makes the batch of a step a function of
(seed, step) alone, so a resumed or multi-process run sees the same examples as one
uninterrupted process.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from lm.config.errors import ConfigError, DataError
from lm.config.sections import DataConfig
from lm.data.sources import TokenizedSplit

# padded mode sorts examples by length inside groups of this many batches.
MEGA_BATCHES = 50


class PaddedCollator:
    """Token-id sequences -> one batch of next-token examples, padded to a common length.

    A sequence of L tokens gives L - 1 examples: ``input_ids`` = seq[:-1], ``targets`` =
    seq[1:], both padded with ``pad_id`` on ``padding_side`` to T = (longest L) - 1, rounded
    up to ``pad_to_multiple_of``. ``key_mask`` and ``loss_mask`` are True at the real
    positions (the same positions, since input and target are aligned). Left padding is for
    batched generation: every row's last token sits in the last column.

    ``max_length`` caps T: a longer sequence keeps its first ``max_length`` + 1 tokens with
    right padding, its last ones with left padding (the context nearest the next token).
    A sequence of fewer than 2 tokens has nothing to predict and is an error (ValueError):
    padded mode never makes one, since documents are chunked to at least 2 tokens.
    """

    def __init__(
        self,
        pad_id: int,
        padding_side: str = "right",
        pad_to_multiple_of: int | None = None,
        max_length: int | None = None,
    ) -> None:
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be right or left, got {padding_side!r}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.pad_id = pad_id
        self.padding_side = padding_side
        self.pad_to_multiple_of = pad_to_multiple_of
        self.max_length = max_length

    def __call__(self, sequences: Sequence[Sequence[int] | np.ndarray]) -> dict[str, torch.Tensor]:
        right = self.padding_side == "right"
        seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
        if not seqs:
            raise ValueError("PaddedCollator: no sequences")
        if self.max_length is not None:
            keep = self.max_length + 1
            seqs = [s[:keep] if right else s[-keep:] for s in seqs]
        short = [i for i, s in enumerate(seqs) if len(s) < 2]
        if short:
            raise ValueError(f"PaddedCollator: sequence {short[0]} has under 2 tokens, no target")
        T = max(len(s) for s in seqs) - 1
        if self.pad_to_multiple_of:
            T = -(-T // self.pad_to_multiple_of) * self.pad_to_multiple_of
        if self.max_length is not None:
            T = min(T, self.max_length)
        input_ids = np.full((len(seqs), T), self.pad_id, np.int64)  # (B, T)
        targets = np.full((len(seqs), T), self.pad_id, np.int64)
        real = np.zeros((len(seqs), T), bool)
        for i, s in enumerate(seqs):
            n = len(s) - 1
            cols = slice(0, n) if right else slice(T - n, T)
            input_ids[i, cols] = s[:-1]
            targets[i, cols] = s[1:]
            real[i, cols] = True
        return {
            "input_ids": torch.from_numpy(input_ids),
            "targets": torch.from_numpy(targets),
            "key_mask": torch.from_numpy(real),
            "loss_mask": torch.from_numpy(real.copy()),
        }


class TrainBatches:
    """The training batches of every optimizer step, computed from (seed, step) alone.

    The global batch of a step holds ``batch_size`` sequences; it is cut into
    ``grad_accum * world_size`` equal parts and micro-batch m of rank r is part
    ``m * world_size + r``. Any (grad_accum, world_size) with the same batch_size therefore
    trains on the same examples at every step, and resuming needs only the step number.

    packed: random windows of context_length + 1 tokens of the token stream, the numpy
    generator seeded with (seed, step). padded: document chunks; epoch e shuffles them with
    (seed, e), sorts them by length inside groups of ``MEGA_BATCHES`` batches (so a batch
    holds similar lengths and little padding), forms batches, and shuffles the batch order.
    The examples of an epoch that do not fill a whole batch (fewer than batch_size, a random
    choice each epoch) wait for the next epoch.
    """

    padding_fraction: float
    """Fraction of target slots that are padding over the first epoch (0.0 when packed)."""
    batches_per_epoch: int | None
    """Steps per pass over the document chunks (padded mode; None when packed)."""
    mean_width: float
    """Positions of a micro-batch's rows, on average over the first epoch: a padded batch is as
    wide as its longest row; packed, the context."""

    def __init__(
        self,
        split: TokenizedSplit,
        cfg: DataConfig,
        context_length: int,
        batch_size: int,
        grad_accum: int,
        pad_id: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        parts = grad_accum * world_size
        if batch_size % parts:
            raise ConfigError(
                f"train.batch_size: {batch_size} is not divisible by grad_accum x processes "
                f"= {grad_accum} x {world_size}"
            )
        self.split = split
        self.cfg = cfg
        self.context_length = context_length
        self.batch_size = batch_size
        self.grad_accum = grad_accum
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.micro_size = batch_size // parts
        self.padding_fraction = 0.0
        self.batches_per_epoch = None
        self.mean_width = float(context_length)
        if cfg.mode == "packed":
            needed = context_length + 2
            if split.n_tokens < needed:
                raise DataError(
                    f"data: the training split has {split.n_tokens} tokens; packed windows of "
                    f"model.context_length={context_length} need at least {needed}"
                )
            return
        self._starts, self._lengths = _chunks(split, context_length)
        self.batches_per_epoch = len(self._starts) // batch_size
        if self.batches_per_epoch == 0:
            raise DataError(
                f"data: the training split makes {len(self._starts)} padded sequences (pieces "
                f"of up to model.context_length+1 tokens), fewer than train.batch_size={batch_size}"
            )
        self._collate = PaddedCollator(pad_id)
        self._plan: tuple[int, np.ndarray] | None = None
        self.padding_fraction, self.mean_width = self._padding(self._epoch(0))

    def step(self, step: int) -> tuple[list[dict[str, torch.Tensor]], int]:
        """The micro-batches (grad_accum of them) this rank trains on at optimizer step `step`,
        and the number of real target tokens in the WHOLE global batch of that step (all
        ranks, all micro-batches)."""
        if self.cfg.mode == "packed":
            rng = np.random.default_rng((self.seed, step))
            high = self.split.n_tokens - self.context_length - 1
            starts = rng.integers(0, high, size=self.batch_size, endpoint=True)
            micro = [
                _packed_batch(self.split, starts[part], self.context_length, self.cfg)
                for part in self._parts()
            ]
            if self.split.answers is None:
                return micro, self.batch_size * self.context_length
            lengths = np.full(len(starts), self.context_length + 1)
            return micro, int(trained_targets(self.split, starts, lengths).sum())
        epoch, index = divmod(step, self.batches_per_epoch)
        rows = self._epoch(epoch)[index]
        micro = []
        for part in self._parts():
            batch = self._collate([self._sequence(i) for i in rows[part]])
            micro.append(_answers_only(batch, self.split, self._starts[rows[part]]))
        if self.split.answers is None:
            return micro, int((self._lengths[rows] - 1).sum())
        counted = trained_targets(self.split, self._starts[rows], self._lengths[rows])
        return micro, int(counted.sum())

    def _parts(self) -> list[slice]:
        # Part m * world_size + rank: at each micro-step every rank holds a neighbouring slice
        # of the length-sorted batch, so ranks wait little for each other.
        size = self.micro_size
        parts = (m * self.world_size + self.rank for m in range(self.grad_accum))
        return [slice(p * size, (p + 1) * size) for p in parts]

    def _sequence(self, i: int) -> np.ndarray:
        start = self._starts[i]
        return self.split.tokens[start : start + self._lengths[i]]

    def _epoch(self, epoch: int) -> np.ndarray:
        """Example indices of the batches of ``epoch``: [batches_per_epoch, batch_size]."""
        if self._plan is not None and self._plan[0] == epoch:
            return self._plan[1]
        rng = np.random.default_rng((self.seed, epoch))
        n_batches, size = self.batches_per_epoch, self.batch_size
        order = rng.permutation(len(self._starts))[: n_batches * size]
        group = np.arange(len(order)) // (MEGA_BATCHES * size)
        # lexsort orders by its last key first: by group, then longest first inside a group.
        order = order[np.lexsort((-self._lengths[order], group))]
        batches = order.reshape(n_batches, size)[rng.permutation(n_batches)]
        self._plan = (epoch, batches)
        return batches

    def _padding(self, batches: np.ndarray) -> tuple[float, float]:
        """The fraction of target slots that are padding, and a micro-batch's mean width."""
        targets = self._lengths[batches].reshape(len(batches), -1, self.micro_size) - 1
        widths = targets.max(axis=-1, keepdims=True)
        return float(1.0 - targets.sum() / (widths.sum() * self.micro_size)), float(widths.mean())


def eval_batches(
    split: TokenizedSplit,
    cfg: DataConfig,
    context_length: int,
    batch_size: int,
    pad_id: int,
    max_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[dict[str, torch.Tensor]]:
    """Deterministic batches covering the whole split: every token but the first is a target
    exactly once. ``context_length`` may exceed the model's (to measure length extrapolation).

    packed: consecutive windows tokens[i*T : i*T + T + 1], the last one shorter and padded.
    padded: every document chunk once, longest first (least padding).
    The first ``max_batches`` batches (all when None) are dealt out: rank r takes r, r + W, ...
    and every rank gets as many batches (see below).
    """
    starts, lengths = eval_windows(split, cfg, context_length)
    n_batches = -(-len(starts) // batch_size)
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    collate = PaddedCollator(pad_id)
    # Every rank runs as many forwards (an FSDP or DDP model communicates in each): one short of
    # a batch in the last round repeats the last batch with no targets (its loss mask all false).
    for b in range(rank, -(-n_batches // world_size) * world_size, world_size):
        i = min(b, n_batches - 1)
        rows = slice(i * batch_size, (i + 1) * batch_size)
        batch = collate(
            [split.tokens[s : s + n] for s, n in zip(starts[rows], lengths[rows], strict=True)]
        )
        batch = _answers_only(batch, split, starts[rows])
        if cfg.mode == "packed" and cfg.document_mask:
            batch["segment_ids"] = _segment_ids(split, starts[rows], batch["input_ids"].shape[1])
        if b >= n_batches:
            batch["loss_mask"] = torch.zeros_like(batch["loss_mask"])
        yield batch


def eval_windows(
    split: TokenizedSplit, cfg: DataConfig, context_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """Where :func:`eval_batches` reads, in its order: each window's start and its number of
    tokens (inputs plus the last target, so at most ``context_length + 1``)."""
    T = context_length
    if cfg.mode == "packed":
        starts = np.arange(0, split.n_tokens - 1, T)
        return starts, np.minimum(starts + T + 1, split.n_tokens) - starts
    starts, lengths = _chunks(split, T)
    longest_first = np.argsort(-lengths, kind="stable")
    return starts[longest_first], lengths[longest_first]


def trained_targets(split: TokenizedSplit, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``[B, max(lengths) - 1]``: True where sequence b (``lengths[b]`` tokens from
    ``starts[b]``) has a target t, the token at ``starts[b] + t + 1``, that is trained on: every
    real target, or for a generated task only those in their document's answer (its <eod>
    included; the next document's prompt not)."""
    T = int(lengths.max()) - 1
    t = np.arange(T)
    real = t < (lengths[:, None] - 1)
    if split.answers is None:
        return real
    g = np.minimum(starts[:, None] + t + 1, split.n_tokens - 1)  # (B, T): each target's index
    doc = np.searchsorted(split.offsets, g, side="right") - 1
    return real & (g - split.offsets[doc] >= split.answers[doc])


def _answers_only(
    batch: dict[str, torch.Tensor], split: TokenizedSplit, starts: np.ndarray
) -> dict[str, torch.Tensor]:
    """``batch`` (right-padded sequences from ``starts``) with a task's prompt targets taken out
    of its loss mask."""
    if split.answers is None:
        return batch
    B, T = batch["loss_mask"].shape
    lengths = batch["loss_mask"].sum(dim=1).numpy() + 1
    trained = np.zeros((B, T), bool)
    counted = trained_targets(split, starts, lengths)
    trained[:, : counted.shape[1]] = counted
    return {**batch, "loss_mask": batch["loss_mask"] & torch.from_numpy(trained)}


def _chunks(split: TokenizedSplit, context_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of every padded-mode example: each document cut into pieces of at most
    context_length + 1 tokens, consecutive pieces sharing one token so that every target of the
    document is predicted exactly once."""
    C = context_length
    doc_start = split.offsets[:-1]
    doc_len = np.diff(split.offsets)
    per_doc = -(-np.maximum(doc_len - 1, 0) // C)  # ceil((len - 1) / C)
    doc = np.repeat(np.arange(split.n_docs), per_doc)
    first_of_doc = np.repeat(np.cumsum(per_doc) - per_doc, per_doc)
    starts = doc_start[doc] + (np.arange(len(doc)) - first_of_doc) * C
    ends = np.minimum(starts + C + 1, doc_start[doc] + doc_len[doc])
    return starts, ends - starts


def _packed_batch(
    split: TokenizedSplit, starts: np.ndarray, context_length: int, cfg: DataConfig
) -> dict[str, torch.Tensor]:
    positions = starts[:, None] + np.arange(context_length + 1)  # (B, T + 1)
    window = torch.from_numpy(split.tokens[positions].astype(np.int64))
    everywhere = torch.ones(len(starts), context_length, dtype=torch.bool)
    batch = _answers_only(
        {
            "input_ids": window[:, :-1].contiguous(),
            "targets": window[:, 1:].contiguous(),
            "key_mask": everywhere,
            "loss_mask": everywhere.clone(),
        },
        split,
        starts,
    )
    if cfg.document_mask:
        batch["segment_ids"] = _segment_ids(split, starts, context_length)
    return batch


def _segment_ids(split: TokenizedSplit, starts: np.ndarray, T: int) -> torch.Tensor:
    """(B, T) index of the document of each input position, counted from the window's first.
    Padding past the end of the split continues the last document, keeping rows non-decreasing."""
    positions = np.minimum(starts[:, None] + np.arange(T), split.n_tokens - 1)
    doc = np.searchsorted(split.offsets, positions, side="right") - 1
    return torch.from_numpy((doc - doc[:, :1]).astype(np.int64))


def model_inputs(
    batch: dict[str, torch.Tensor], device: torch.device, key_mask: bool = False
) -> dict[str, Any]:
    """Move a batch to ``device`` and keep only the masks the model needs (``key_mask``: always
    keep it, for random positions, whose draw depends on each row's count of real tokens).

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
    if key_mask or "segment_ids" in batch or not _right_padded(batch["key_mask"]):
        inputs["key_mask"] = moved["key_mask"]
    if "segment_ids" in moved:
        inputs["segment_ids"] = moved["segment_ids"]
    loss_mask = None if bool(batch["loss_mask"].all()) else moved["loss_mask"]
    return {"inputs": inputs, "targets": moved["targets"], "loss_mask": loss_mask}


def _right_padded(key_mask: torch.Tensor) -> bool:
    """True when no real token follows a pad in any row of ``key_mask [B, T]`` (host tensor);
    an all-True mask counts."""
    return bool((key_mask[:, 1:] <= key_mask[:, :-1]).all())
