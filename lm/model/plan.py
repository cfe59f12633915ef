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
from typing import Any

import torch

from lm.config.names import LEARNED_BIASES, NO_FLEX, SCHEME_PLACES
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
    """The kernel that runs: sdpa | flex | math (``model.kernel``, resolved for this pass), or
    stick_breaking (``model.normalize``, the notes' formula with another normalization)."""
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
    keys_read: torch.Tensor | None = None
    """How many keys each query reads, ``[B|1, 1, Lq, 1]`` (SSMax's n); None: not needed."""
    rotation: tuple[torch.Tensor, torch.Tensor] | None = None
    """RoPE's cos and sin at ``positions``, ``[..., Lq, d_k/2]`` each."""
    shared: dict[tuple[type, int | None], Any] = field(default_factory=dict)
    """What the layers of one scheme share (ALiBi's additive mask, xPos's angles), by the
    scheme's part class and the layers' window: a hybrid of two such schemes keeps one of
    each."""
    window: int | None = None
    """The sliding window of the layers this plan serves (None: every key), :meth:`at_window`."""
    views: dict[int | None, dict[str, Any]] = field(default_factory=dict)
    """``mask``, ``no_keys``, ``is_causal`` and ``keys_read`` for each window of the model."""

    def at_window(self, window: int | None) -> Plan:
        """The plan of the layers whose queries read at most the last ``window`` keys."""
        if window == self.window:
            return self
        return dataclasses.replace(self, window=window, **self.views[window])

    def sharing(self, kind: type, value: Any) -> Plan:
        """This plan with ``value`` shared by every layer whose part is a ``kind`` and whose window
        is this plan's."""
        return dataclasses.replace(self, shared={**self.shared, (kind, self.window): value})

    def shared_by(self, kind: type) -> Any:
        """What :meth:`sharing` holds for ``kind`` at this plan's window."""
        return self.shared[(kind, self.window)]

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
    every query read every key. In training with ``model.random_positions`` (and with
    ``model.random_positions_eval`` in every pass without a cache), positions are drawn at
    random (:func:`lm.model.masks.random_positions`). Reads the cache, never moves it.
    """
    T, device = input_ids.shape[1], input_ids.device
    first = cache.start if cache is not None else 0  # the new tokens' first slot
    limit = first + T
    if cache is not None:
        dense = cache.positions  # (B, T), each row counting on from its own real tokens
        key_mask, dense_keys = cache.key_mask, cache.key_positions  # (B, capacity) each
    else:
        if segments is not None:
            dense = positions_from_segments(segments)
        elif key_mask is not None:
            dense = positions_from_mask(key_mask)
        else:
            dense = torch.arange(T, device=device)
        dense_keys = dense
    positions, key_positions = dense, dense_keys  # what a scheme reads; windows read dense ones
    drawn = training or config.random_positions_eval  # Ruoss et al.'s code draws at every call
    if cache is None and drawn and config.random_positions is not None:
        limit = config.random_positions
        B = input_ids.shape[0]
        positions = key_positions = random_positions(B, T, limit, key_mask, segments, device)
    # One new query with a cache: the filled slots are exactly what it may read.
    causal = causal and (cache is None or T > 1)
    windows = sorted(set(config.layer_windows), key=lambda w: -1 if w is None else w)
    masked = key_mask is not None or segments is not None or windows != [None]
    biased = any(SCHEME_PLACES[name] == "scores" for name in config.layer_positions)
    learned = not set(config.layer_positions).isdisjoint(LEARNED_BIASES)
    flexless = not set(config.layer_positions).isdisjoint(NO_FLEX)
    dropout = config.dropout if training else 0.0
    if config.normalize == "stick_breaking":  # its own formula, written out, whatever the kernel
        chosen = "stick_breaking"
    else:
        setting = kernel or config.kernel
        chosen = _kernel(setting, device, masked or biased, learned, flexless, cache, dropout)
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    views = {}
    for window in windows:  # what each window's layers read: a mask in the kernel's form
        if chosen == "flex":
            mask = flex_block_mask(key_mask, segments, causal, T, device, window, dense)
            view = dict(is_causal=False, mask=mask, no_keys=None)
        elif chosen == "sdpa" and causal and not (masked or biased):
            view = dict(is_causal=True, mask=None, no_keys=None)
        else:
            Lk = dense_keys.shape[-1]
            mask, no_keys = allowed_keys(
                key_mask, segments, causal, T, Lk, first, device, window, dense, dense_keys
            )
            view = dict(is_causal=False, mask=mask, no_keys=no_keys)
        if config.normalize == "ssmax":  # n: the real keys up to the query, within the window
            read = (dense + 1) if causal or cache is not None else dense.new_full(dense.shape, T)
            read = read if window is None else read.clamp(max=window)
            view["keys_read"] = read.view(-1, 1, T, 1)
        views[window] = view
    return Plan(
        positions=positions,
        key_positions=key_positions,
        position_limit=limit,
        batch=input_ids.shape[0],
        heads=config.n_head,
        kernel=chosen,
        dtype=dtype,
        window=windows[0],
        views=views,
        **views[windows[0]],
    )


def _kernel(
    setting: str,
    device: torch.device,
    needs_mask: bool,
    learned_bias: bool,
    flexless: bool,
    cache: KVCache | None,
    dropout: float,
) -> str:
    """The kernel for this pass. FlexAttention needs no KV cache, no attention dropout, and a
    backward pass where gradients are on (none on CPU); ``sdpa`` picks it only for a mask or a
    bias in a model compiled for a GPU (on CPU it measured no faster: docs/performance.md,
    "Masked attention"). On CPU, the gradient of a learned bias goes through the notes' formula:
    SDPA then runs PyTorch's own math path, whose softmax backward sums in parts that depend on
    the thread count, so a run's numbers would too (``softmax_rows`` sums each row whole).
    ``auto``, which ``lm train`` resolves before it builds a model, runs as ``sdpa`` wherever
    a model is built with it unresolved."""
    if setting == "math":
        return "math"
    if learned_bias and device.type == "cpu" and torch.is_grad_enabled():
        return "math"
    flex = FLEX_AVAILABLE and cache is None and not dropout and not flexless
    flex = flex and (flex_backward(device) or not torch.is_grad_enabled())
    compiled_gpu = device.type == "cuda" and torch.compiler.is_compiling()
    if flex and (setting == "flex" or (needs_mask and compiled_gpu)):
        return "flex"
    return "sdpa"
