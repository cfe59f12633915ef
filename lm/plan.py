"""What every attention layer of one forward pass shares, built once by the model: where each
query and key sits, which keys each query may read (causality, documents, padding) in the form
the chosen kernel takes, and what the position scheme adds (RoPE's angles, a score bias). A
mask is a boolean tensor (True = may attend; its causal part is the notes' causal mask) or, for
FlexAttention, a block mask; a score bias is added to the mask tensor (-inf where blocked) or
given to FlexAttention as a score function. A query row whose every key is blocked (left padding
makes such rows) reads every key instead and is zeroed afterwards, so no kernel sees an empty
row. With ``model.attention: sdpa`` plain causal attention takes SDPA's mask-free causal path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from lm.config import ModelConfig
from lm.kernels import FLEX_AVAILABLE, causal_mask, flex_backward
from lm.position import SCHEMES, positions_from_mask, positions_from_segments, random_positions

try:  # PyTorch >= 2.5
    from torch.nn.attention.flex_attention import create_block_mask
except ImportError:  # pragma: no cover - the pinned PyTorch has it
    create_block_mask = None

if TYPE_CHECKING:
    from lm.cache import KVCache

Bias = torch.Tensor | Callable
"""A score bias as a kernel takes it: an additive mask ``[B|1, H, Lq, Lk]`` that holds the
blocked keys' -inf too, or FlexAttention's ``score_mod(score, b, h, q, k)``."""

Score = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""A position bias as its paper writes it: ``score(head, query_position, key_position)``."""


@dataclass(frozen=True)
class Plan:
    """One forward pass's positions and masks, the same for every layer."""

    positions: torch.Tensor
    """Each query's position ``[Lq]`` or ``[B, Lq]``: real tokens counted from 0."""
    key_positions: torch.Tensor
    """Each key slot's position ``[Lk]`` or ``[B, Lk]`` (with a KV cache, every slot)."""
    end: int
    """Every position is below it (known without a device read): the slots filled after this
    pass, or ``model.random_positions`` in training with random positions."""
    batch: int
    heads: int
    kernel: str
    """causal (SDPA, no mask tensor) | masked (SDPA) | flex | math."""
    mask: object
    """Where each query may read: None (every key, or causal), boolean ``[B|1, 1, Lq, Lk]`` (or
    ``[Lq, Lk]``), or a block mask (flex)."""
    empty: torch.Tensor | None
    """``[B, 1, Lq, 1]``: queries with no key to read, zeroed after the kernel; None: none."""
    dtype: torch.dtype
    """The scores' dtype, which an additive mask must have."""
    rotation: tuple[torch.Tensor, torch.Tensor] | None = None
    """RoPE's cos and sin at ``positions``, ``[..., Lq, d_k/2]`` each."""
    biases: dict[type, Bias] = field(default_factory=dict)
    """Position biases that the layers of one scheme share (ALiBi's), in the kernel's form, by
    the scheme's part class: a hybrid of two such schemes keeps one of each."""

    def sharing(self, kind: type, bias: Bias) -> Plan:
        """This plan with ``bias`` shared by every layer whose part is a ``kind``."""
        return dataclasses.replace(self, biases={**self.biases, kind: bias})

    def score_bias(self, score: Score) -> Bias:
        """``score`` in the form the kernel takes: a FlexAttention score function, or an
        additive mask ``[B|1, H, Lq, Lk]`` (blocked keys -inf), computed in fp32 and then cast."""
        Lq, Lk = self.positions.shape[-1], self.key_positions.shape[-1]
        if self.kernel == "flex":
            pos = self.positions.view(-1, Lq).expand(self.batch, -1)  # (B, Lq)
            key_pos = self.key_positions.view(-1, Lk).expand(self.batch, -1)  # (B, Lk)

            def score_mod(s, b, h, q, k):
                return s + score(h, pos[b, q], key_pos[b, k])

            return score_mod
        head = torch.arange(self.heads, device=self.positions.device).view(1, -1, 1, 1)
        q = self.positions.view(-1, 1, Lq, 1)  # (B|1, 1, Lq, 1)
        k = self.key_positions.view(-1, 1, 1, Lk)
        bias = score(head, q, k).to(self.dtype)  # (B|1, H, Lq, Lk)
        return bias if self.mask is None else bias.masked_fill(~self.mask, float("-inf"))


def build_plan(
    config: ModelConfig,
    input_ids: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    segments: torch.Tensor | None = None,
    cache: KVCache | None = None,
    *,
    causal: bool = True,
    training: bool = False,
    kernel: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Plan:
    """The plan of a forward pass over ``input_ids [B, T]``: ``key_mask [B, T]`` (True = real
    token), ``segments [B, T]`` (each token's document: attention stays inside it and positions
    restart), ``cache`` a :class:`lm.cache.KVCache` that the new tokens extend; ``kernel``
    replaces ``config.attention``; ``causal=False`` lets every query read every key. In
    training with ``model.random_positions``, positions are drawn at random (lm.position)."""
    T, device = input_ids.shape[1], input_ids.device
    first = cache.length if cache is not None else 0  # the new tokens' first slot
    end = first + T
    if cache is None and training and config.random_positions is not None:
        end = config.random_positions
        B = input_ids.shape[0]
        positions = random_positions(B, T, end, key_mask, segments, device)
        key_positions = positions
    elif cache is not None:
        new = key_mask if key_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        positions = cache.extend(new)  # (B, T), each row counting on from its own real tokens
        key_mask, key_positions = cache.key_mask, cache.key_positions  # (B, capacity) each
    else:
        if segments is not None:
            positions = positions_from_segments(segments)
        elif key_mask is not None:
            positions = positions_from_mask(key_mask)
        else:
            positions = torch.arange(T, device=device)
        key_positions = positions
    # One new query with a cache: the filled slots are exactly what it may read.
    causal = causal and (cache is None or T > 1)
    masked = key_mask is not None or segments is not None
    biased = any(SCHEMES[name].acts_on == "scores" for name in config.layer_positions)
    dropout = config.dropout if training else 0.0
    chosen = _kernel(kernel or config.attention, device, causal, masked or biased, cache, dropout)
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    where = dict(positions=positions, key_positions=key_positions, end=end)
    common = dict(where, batch=input_ids.shape[0], heads=config.n_head, kernel=chosen, dtype=dtype)
    if chosen == "flex":
        return Plan(**common, mask=_block_mask(key_mask, segments, causal, T, device), empty=None)
    if chosen == "causal":
        return Plan(**common, mask=None, empty=None)
    Lk = key_positions.shape[-1]
    return Plan(**common, **_allowed(key_mask, segments, causal, T, Lk, first, device))


def _kernel(
    setting: str,
    device: torch.device,
    causal: bool,
    needs_mask: bool,
    cache: KVCache | None,
    dropout: float,
) -> str:
    """The kernel for this pass. FlexAttention needs no KV cache, no attention dropout, and a
    backward pass where gradients are on (none on CPU); ``sdpa`` picks it only for a mask or a
    bias in a model compiled for a GPU (on CPU it measured no faster: README, "Masked
    attention")."""
    if setting == "math":
        return "math"
    flex = FLEX_AVAILABLE and cache is None and not dropout
    flex = flex and (flex_backward(device) or not torch.is_grad_enabled())
    compiled_gpu = device.type == "cuda" and torch.compiler.is_compiling()
    if flex and (setting == "flex" or (needs_mask and compiled_gpu)):
        return "flex"
    return "causal" if causal and not needs_mask else "masked"


def _allowed(
    key_mask: torch.Tensor | None,
    segments: torch.Tensor | None,
    causal: bool,
    Lq: int,
    Lk: int,
    first: int,
    device: torch.device,
) -> dict[str, torch.Tensor | None]:
    """``mask``: which keys each query may read (boolean, broadcastable to ``[B, H, Lq, Lk]``;
    None: all), and ``empty``: the rows left with none (``[B, 1, Lq, 1]``), which read every key
    instead."""
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
    if mask is None:
        return {"mask": allowed, "empty": None}  # causality alone leaves every query its own key
    empty = ~allowed.any(dim=-1, keepdim=True)
    return {"mask": allowed | empty, "empty": empty}


def _block_mask(
    key_mask: torch.Tensor | None,
    segments: torch.Tensor | None,
    causal: bool,
    L: int,
    device: torch.device,
):
    """FlexAttention's block mask for these masks; None when every key is allowed."""

    def allowed(b, h, q, k):  # True where query q may read key k
        ok = q >= k if causal else q == q
        if segments is not None:
            ok = ok & (segments[b, q] == segments[b, k])
        if key_mask is not None:
            ok = ok & key_mask[b, k]
        return ok

    rows = next((t.shape[0] for t in (key_mask, segments) if t is not None), None)
    if not causal and rows is None:
        return None
    return create_block_mask(allowed, rows, None, L, L, device)
