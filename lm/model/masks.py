"""Where each token sits and which keys each query may read (notes, "A causal mask removes
future positions before softmax" and "Implementation detail: padding masks exclude absent
tokens"): the two things a forward pass works out once, before any layer runs.

:func:`positions` is what every layer shares, :class:`Positions`: each query's and key's position,
counting real tokens only (padding takes no position and each packed document starts again at 0:
:func:`positions_from_mask`, :func:`positions_from_segments`; in training, positions may be drawn
at random instead, :func:`random_positions`). :func:`masks` is what the layers of one sliding
window need, :class:`Mask`: the notes' ``M`` (:func:`causal_mask`, with the key mask of a padded
batch and the document mask of a packed one) in the form the forward pass's kernel takes, a
boolean tensor (True = may read, :func:`allowed_keys`), a FlexAttention block mask
(:func:`flex_block_mask`), or nothing at all where SDPA applies the causal order itself. A
scheme's score bias ``B`` stays apart from ``M`` until the kernel adds them
(``lm.model.attention.attend``). A query row whose every key is blocked (left padding makes such
rows) reads every key instead and is zeroed afterwards, so no kernel sees an empty row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import torch

from lm.config.names import Place
from lm.config.sections import ModelConfig
from lm.model.kernels import choose_kernel

try:  # PyTorch >= 2.5
    from torch.nn.attention.flex_attention import create_block_mask
except ImportError:  # pragma: no cover - the pinned PyTorch has it
    create_block_mask = None


def causal_mask(
    L: int, device: torch.device | str | None = None, *, keys: int | None = None, first: int = 0
) -> torch.Tensor:
    """The notes' additive causal mask ``[L, L]``: 0 on and below the diagonal, -inf above.

    With a KV cache the L queries sit at key slots ``first .. first + L - 1`` of ``keys`` slots,
    and query i may read slots up to ``first + i``: ``[L, keys]``.
    """
    keys = L if keys is None else keys
    blocked = torch.ones(L, keys, dtype=torch.bool, device=device).triu(diagonal=first + 1)
    return torch.zeros(L, keys, device=device).masked_fill(blocked, float("-inf"))


def allowed_keys(
    key_mask: torch.Tensor | None,
    segments: torch.Tensor | None,
    causal: bool,
    Lq: int,
    Lk: int,
    first: int,
    device: torch.device,
    window: int | None = None,
    positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(mask, no_keys)``: which keys each query may read (boolean, broadcastable to ``[B, H,
    Lq, Lk]``; None: all), and the query rows left with none (``[B, 1, Lq, 1]``; None: no such
    row), which read every key instead so that no kernel meets an empty row. ``window``: a query
    also reads no key ``window`` or more real tokens before it (``positions`` and
    ``key_positions``, ``[B|1, L]``, count real tokens), the restriction of a sliding window."""
    mask = None
    if key_mask is not None:
        mask = key_mask[:, None, None, :]  # (B, 1, 1, Lk): the same for every query
    if segments is not None:  # (B, 1, L, L): True where query and key share a document
        same = (segments[:, :, None] == segments[:, None, :])[:, None]
        mask = same if mask is None else mask & same
    allowed = mask
    if causal:  # (Lq, Lk): query i reads slots up to first + i
        order = causal_mask(Lq, device, keys=Lk, first=first) == 0
        allowed = order if mask is None else mask & order
    if window is not None:  # (B|1, 1, Lq, Lk): at most window - 1 real tokens back
        q = positions.view(-1, 1, Lq, 1)
        k = key_positions.view(-1, 1, 1, Lk)
        near = q - k < window
        allowed = near if allowed is None else allowed & near
    if mask is None:
        return allowed, None  # causality alone leaves every query its own key
    no_keys = ~allowed.any(dim=-1, keepdim=True)
    return allowed | no_keys, no_keys


def flex_block_mask(
    key_mask: torch.Tensor | None,
    segments: torch.Tensor | None,
    causal: bool,
    L: int,
    device: torch.device,
    window: int | None = None,
    positions: torch.Tensor | None = None,
):
    """FlexAttention's block mask for these masks (wholly blocked blocks are skipped, so a sliding
    window costs only its blocks); None when every key is allowed. ``positions`` ``[B|1, L]``
    count real tokens, which a window measures."""
    pos = None if window is None else positions.view(-1, L)

    def allowed(b, h, q, k):  # True where query q may read key k
        ok = q >= k if causal else q == q
        if segments is not None:
            ok = ok & (segments[b, q] == segments[b, k])
        if key_mask is not None:
            ok = ok & key_mask[b, k]
        if pos is not None:
            row = b if pos.shape[0] > 1 else 0
            ok = ok & (pos[row, q] - pos[row, k] < window)
        return ok

    rows = next((t.shape[0] for t in (key_mask, segments) if t is not None), None)
    if not causal and rows is None and window is None:
        return None
    return create_block_mask(allowed, rows, None, L, L, device)


# Where each token sits.


def positions_from_mask(key_mask: torch.Tensor, start: torch.Tensor | int = 0) -> torch.Tensor:
    """Positions that count real tokens only: ``[B, L]``, pads get the position of the next one.

    ``start`` (an int or ``[B]``) is each row's count of real tokens before these, for decoding.
    """
    start = torch.as_tensor(start, device=key_mask.device).reshape(-1, 1)
    return (start + key_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def random_positions(
    batch: int,
    length: int,
    limit: int,
    key_mask: torch.Tensor | None = None,
    segments: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
    Generalization of Transformers"): every run of tokens that counts its positions from 0 (a
    row's real tokens, or one document of a packed row) gets, for its n positions, n distinct
    integers drawn at random from ``[0, limit)`` and sorted, instead of ``0 .. n-1``. So a model
    trained on short sequences has seen the positions of sequences up to ``limit``. ``[batch,
    length]``, drawn from torch's generator (a checkpoint keeps its state).

    lm draws them in training (:func:`positions`); evaluation and sampling read ``0 .. n-1``, unless
    ``model.random_positions_eval`` draws them there too, as the paper's code
    (google-deepmind/randomized_positional_encodings) does at every call (its draw is one per
    batch rather than per sequence)."""
    starts = torch.zeros(batch, length, dtype=torch.bool, device=device)
    for marks in (key_mask, segments):  # a run ends where padding or the document changes
        if marks is not None:
            starts[:, 1:] |= marks[:, 1:] != marks[:, :-1]
    run = starts.long().cumsum(dim=1) * limit  # (B, T): orders the runs, in row order
    draw = torch.rand(batch, limit, device=device).argsort(dim=1)[:, :length]  # distinct
    return (run + draw).sort(dim=1).values - run  # each run's own draws, ascending


def positions_from_segments(segment_ids: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 where the segment id changes, ``[B, L]``."""
    B, L = segment_ids.shape
    index = torch.arange(L, device=segment_ids.device).expand(B, L)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first


# What a forward pass works out once.


@dataclass(frozen=True)
class Positions:
    """Where the tokens of one forward pass sit, read once for every layer."""

    queries: torch.Tensor
    """Each query's position ``[Lq]`` or ``[B, Lq]``, as a position scheme reads it."""
    keys: torch.Tensor
    """Each key slot's position ``[Lk]`` or ``[B, Lk]`` (with a KV cache, every slot)."""
    limit: int
    """Every position is below it, known without a device read: the slots filled after this
    pass, or ``model.random_positions`` where positions are drawn."""
    batch: int
    counted: tuple[torch.Tensor, torch.Tensor]
    """Queries' and keys' real tokens counted from 0, which a window measures: ``queries`` and
    ``keys`` unless those were drawn at random."""
    previous: torch.Tensor | None = None
    """With ``model.smear_keys``: each token's previous real token of its document, an index into
    this pass's tokens ``[B|1, Lq]`` (-1: the last key a KV cache kept from an earlier pass; its
    own index where there is none: :func:`previous_tokens`)."""
    biases: dict[type, Any] = field(default_factory=dict)
    """The score bias ``B`` of each scheme whose layers share one (ALiBi's, T5's), by its class:
    made once by the model from these positions (``ScoreBias.bias``) before any layer reads it."""


@dataclass(frozen=True)
class Mask:
    """The notes' ``M`` for the layers of one window, in the form the pass's kernel takes."""

    kernel: str
    """sdpa | flex | math, or stick_breaking (``lm.model.kernels.choose_kernel``)."""
    allowed: Any = None
    """Which keys each query may read: boolean ``[B|1, 1, Lq, Lk]`` or ``[Lq, Lk]`` (True = may
    read), a block mask (flex), or None: every key (in causal order if ``causal``)."""
    no_keys: torch.Tensor | None = None
    """``[B, 1, Lq, 1]``: queries with no key to read, zeroed after the kernel; None: none."""
    causal: bool = False
    """The kernel applies the causal order itself (SDPA's mask-free causal path)."""
    keys_read: torch.Tensor | None = None
    """How many keys each query reads, ``[B|1, 1, Lq, 1]`` (SSMax's n); None: not needed."""


def positions(
    config: ModelConfig, input_ids, key_mask=None, segments=None, cache=None, training=False
) -> Positions:
    """Where the tokens ``input_ids`` sit, with ``key_mask`` (True = real token) and ``segments``
    (each token's document), ``[B, T]`` each, and ``cache`` (a ``KVCache`` whose newest slots
    these tokens took): each row counts its own real tokens from 0."""
    (B, T), device = input_ids.shape, input_ids.device
    if cache is not None:
        queries, keys = cache.positions, cache.key_positions
    elif segments is not None:
        queries = keys = positions_from_segments(segments)
    elif key_mask is not None:
        queries = keys = positions_from_mask(key_mask)
    else:
        queries = keys = torch.arange(T, device=device)
    counted, limit = (queries, keys), T + (0 if cache is None else cache.start)
    drawn = training or config.random_positions_eval  # (model.random_positions_eval)
    if drawn and cache is None and config.random_positions is not None:  # Ruoss et al.
        limit = config.random_positions
        queries = keys = random_positions(B, T, limit, key_mask, segments, device)
    previous = previous_tokens(counted[0], key_mask, segments) if config.smear_keys else None
    return Positions(queries, keys, limit, B, counted, previous)


def previous_tokens(counted: torch.Tensor, key_mask=None, segments=None) -> torch.Tensor:
    """Each token's previous real token in its document (smeared keys read its key), ``[B|1,
    T]``: an index into these T tokens; -1 where it came in an earlier pass (a KV cache keeps its
    key); the token's own index where it has none (its document's, or its row's, first token).
    ``counted`` ``[B|1, T]``: the real tokens before each in its document, as positions count
    them (a packed row's documents by ``segments`` alone, as positions do)."""
    T, device = counted.shape[-1], counted.device
    index = torch.arange(T, device=device)
    before = index - 1  # packed documents have no pads: the token before
    if key_mask is not None and segments is None:  # the last real token before, past any pads
        last = torch.where(key_mask, index, -1).cummax(dim=1).values
        before = torch.cat([last.new_full((last.shape[0], 1), -1), last[:, :-1]], dim=1)
    return torch.where(counted > 0, before, index).view(-1, T)


def masks(
    config,
    where,
    key_mask=None,
    segments=None,
    cache=None,
    causal=True,
    training=False,
    kernel=None,
) -> dict[int | None, Mask]:
    """Each window's ``M`` (None: every key) for the pass whose tokens sit at ``where``, in the
    form of the kernel it runs (``kernel`` in place of ``model.kernel``); ``causal=False``:
    every query reads every key."""
    (queries, keys), first = where.counted, 0
    T, device = queries.shape[-1], queries.device
    if cache is not None:  # the filled slots are what the new tokens may read
        first, key_mask, causal = cache.start, cache.key_mask, causal and T > 1
    biased = Place.SCORES in map(attrgetter("place"), config.rows)  # B: M is a tensor
    plain = key_mask is None and segments is None and set(config.layer_windows) == {None}
    plain = plain and not biased
    kernel = choose_kernel(kernel or config.kernel, config, device, not plain, cache, training)
    out, ssmax, ordered = {}, config.normalize == "ssmax", causal or cache is not None
    for window in dict.fromkeys(config.layer_windows):
        read = keys_read(queries, window, ordered) if ssmax else None  # SSMax's n
        if kernel == "sdpa" and causal and plain:  # SDPA's own causal path
            out[window] = Mask(kernel, causal=True, keys_read=read)
        elif kernel == "flex":
            allowed = flex_block_mask(key_mask, segments, causal, T, device, window, queries)
            out[window] = Mask(kernel, allowed, keys_read=read)
        else:
            allowed = allowed_keys(
                key_mask, segments, causal, T, keys.shape[-1], first, device, window, queries, keys
            )
            out[window] = Mask(kernel, *allowed, keys_read=read)
    return out


def keys_read(counted: torch.Tensor, window: int | None, causal: bool) -> torch.Tensor:
    """SSMax's n, ``[B|1, 1, T, 1]``: the real keys up to each query (all T without the causal
    order), within the window."""
    T = counted.shape[-1]
    read = (counted + 1) if causal else counted.new_full(counted.shape, T)
    read = read if window is None else read.clamp(max=window)
    return read.view(-1, 1, T, 1)
