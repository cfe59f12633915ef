"""What every attention layer of one forward pass shares, built once by the model: where each
query and key sits, which keys each query may read (causality, documents, padding) in the form
the chosen kernel takes, and what the position scheme shares across layers (RoPE's angles, a
score bias). A mask is a boolean tensor (True = may read; its causal part is the notes' causal
mask), or, for FlexAttention, a block mask. A scheme's score bias ``B`` joins the mask as the
additive mask ``M + B`` (-inf where ``M`` blocks), or as FlexAttention's score function. A query
row whose every key is blocked (left padding makes such rows) reads every key instead and is
zeroed afterwards, so no kernel sees an empty row. Plain causal attention under SDPA takes its
mask-free causal path (``is_causal``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from lm.config.names import LEARNED_BIASES, SCHEME_PLACES
from lm.config.sections import ModelConfig
from lm.model.cache import KVCache
from lm.model.kernels import FLEX_AVAILABLE, flex_backward
from lm.model.masks import (
    allowed_keys,
    flex_block_mask,
    positions_from_mask,
    positions_from_segments,
    random_positions,
)

AdditiveMask = torch.Tensor | Callable
"""``M + B`` as a kernel takes it: a float tensor ``[B|1, H, Lq, Lk]`` (the bias ``B``, -inf
where the mask ``M`` blocks), or FlexAttention's ``score_mod(score, b, h, q, k)``, which adds
``B`` (``M`` is then the block mask)."""

BiasAt = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""A position bias as its paper writes it: ``bias_at(head, query_position, key_position)``."""


@dataclass(frozen=True)
class Plan:
    """One forward pass's positions and masks, the same for every layer."""

    positions: torch.Tensor
    """Each query's position ``[Lq]`` or ``[B, Lq]``: real tokens counted from 0."""
    key_positions: torch.Tensor
    """Each key slot's position ``[Lk]`` or ``[B, Lk]`` (with a KV cache, every slot)."""
    position_limit: int
    """Every position is below it, known without a device read: the slots filled after this
    pass, or ``model.random_positions`` in training with random positions."""
    batch: int
    heads: int
    kernel: str
    """The kernel that runs: sdpa | flex | math (``model.kernel``, resolved for this pass)."""
    is_causal: bool
    """True when ``mask`` is None and the kernel applies the causal mask itself (SDPA's
    mask-free causal path); otherwise the causal order, if any, is in ``mask``."""
    mask: object
    """Which keys each query may read: None (every key, or causal by ``is_causal``), boolean
    ``[B|1, 1, Lq, Lk]`` (or ``[Lq, Lk]``), or a block mask (flex)."""
    no_keys: torch.Tensor | None
    """``[B, 1, Lq, 1]``: queries with no key to read, zeroed after the kernel; None: none."""
    dtype: torch.dtype
    """The scores' dtype, which an additive mask must have."""
    rotation: tuple[torch.Tensor, torch.Tensor] | None = None
    """RoPE's cos and sin at ``positions``, ``[..., Lq, d_k/2]`` each."""
    shared: dict[type, AdditiveMask] = field(default_factory=dict)
    """Additive masks that the layers of one scheme share (ALiBi's, T5's), by the scheme's part
    class: a hybrid of two such schemes keeps one of each."""

    def sharing(self, kind: type, added: AdditiveMask) -> Plan:
        """This plan with ``added`` shared by every layer whose part is a ``kind``."""
        return dataclasses.replace(self, shared={**self.shared, kind: added})

    def additive_mask(self, bias_at: BiasAt) -> AdditiveMask:
        """``M + B`` for the bias ``bias_at`` in the form the kernel takes: a FlexAttention score
        function, or a float tensor ``[B|1, H, Lq, Lk]`` computed in fp32 and then cast."""
        Lq, Lk = self.positions.shape[-1], self.key_positions.shape[-1]
        if self.kernel == "flex":
            pos = self.positions.view(-1, Lq).expand(self.batch, -1)  # (B, Lq)
            key_pos = self.key_positions.view(-1, Lk).expand(self.batch, -1)  # (B, Lk)

            def score_mod(s, b, h, q, k):
                return s + bias_at(h, pos[b, q], key_pos[b, k])

            return score_mod
        head = torch.arange(self.heads, device=self.positions.device).view(1, -1, 1, 1)
        q = self.positions.view(-1, 1, Lq, 1)  # (B|1, 1, Lq, 1)
        k = self.key_positions.view(-1, 1, 1, Lk)
        bias = bias_at(head, q, k).to(self.dtype)  # (B|1, H, Lq, Lk)
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
    restart), ``cache`` a :class:`KVCache` whose newest slots these tokens took
    (``cache.extend``, before); ``kernel`` replaces ``config.kernel``; ``causal=False`` lets
    every query read every key. In training with ``model.random_positions``, positions are
    drawn at random (:func:`lm.model.masks.random_positions`). Reads the cache, never moves it.
    """
    T, device = input_ids.shape[1], input_ids.device
    first = cache.start if cache is not None else 0  # the new tokens' first slot
    limit = first + T
    if cache is None and training and config.random_positions is not None:
        limit = config.random_positions
        B = input_ids.shape[0]
        positions = random_positions(B, T, limit, key_mask, segments, device)
        key_positions = positions
    elif cache is not None:
        positions = cache.positions  # (B, T), each row counting on from its own real tokens
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
    biased = any(SCHEME_PLACES[name] == "scores" for name in config.layer_positions)
    learned = not set(config.layer_positions).isdisjoint(LEARNED_BIASES)
    dropout = config.dropout if training else 0.0
    chosen = _kernel(kernel or config.kernel, device, masked or biased, learned, cache, dropout)
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    where = dict(positions=positions, key_positions=key_positions, position_limit=limit)
    common = dict(where, batch=input_ids.shape[0], heads=config.n_head, kernel=chosen, dtype=dtype)
    if chosen == "flex":
        mask = flex_block_mask(key_mask, segments, causal, T, device)
        return Plan(**common, is_causal=False, mask=mask, no_keys=None)
    if chosen == "sdpa" and causal and not (masked or biased):
        return Plan(**common, is_causal=True, mask=None, no_keys=None)
    Lk = key_positions.shape[-1]
    mask, no_keys = allowed_keys(key_mask, segments, causal, T, Lk, first, device)
    return Plan(**common, is_causal=False, mask=mask, no_keys=no_keys)


def _kernel(
    setting: str,
    device: torch.device,
    needs_mask: bool,
    learned_bias: bool,
    cache: KVCache | None,
    dropout: float,
) -> str:
    """The kernel for this pass. FlexAttention needs no KV cache, no attention dropout, and a
    backward pass where gradients are on (none on CPU); ``sdpa`` picks it only for a mask or a
    bias in a model compiled for a GPU (on CPU it measured no faster: docs/performance.md,
    "Masked attention"). On CPU, the gradient of a learned bias goes through the notes' formula:
    SDPA then runs PyTorch's own math path, whose softmax backward sums in parts that depend on
    the thread count, so a run's numbers would too (``softmax_rows`` sums each row whole)."""
    if setting == "math":
        return "math"
    if learned_bias and device.type == "cpu" and torch.is_grad_enabled():
        return "math"
    flex = FLEX_AVAILABLE and cache is None and not dropout
    flex = flex and (flex_backward(device) or not torch.is_grad_enabled())
    compiled_gpu = device.type == "cuda" and torch.compiler.is_compiling()
    if flex and (setting == "flex" or (needs_mask and compiled_gpu)):
        return "flex"
    return "sdpa"
