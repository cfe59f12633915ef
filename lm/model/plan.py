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

from lm.config.names import SCORE_BIASES
from lm.config.sections import ModelConfig
from lm.model.cache import KVCache
from lm.model.kernels import choose_kernel
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
    scheme's class and the layers' window: a hybrid of two such schemes keeps one of each."""
    window: int | None = None
    """The sliding window of the layers this plan serves (None: every key), :meth:`at_window`."""
    views: dict[int | None, dict[str, Any]] = field(default_factory=dict)
    """``mask``, ``no_keys``, ``is_causal`` and ``keys_read`` for each window of the model."""
    weights: list | None = None
    """A list: each attention layer appends its ``(S + M, A)`` ``[B, H, Lq, Lk]`` (kernel math
    or stick_breaking), what the attention pictures show; None: nothing kept."""

    def at_window(self, window: int | None) -> Plan:
        """The plan of the layers whose queries read at most the last ``window`` keys."""
        if window == self.window:
            return self
        return dataclasses.replace(self, window=window, **self.views[window])

    def sharing(self, kind: type, value: Any) -> Plan:
        """This plan with ``value`` shared by every layer whose scheme is a ``kind`` and whose
        window is this plan's."""
        return dataclasses.replace(self, shared={**self.shared, (kind, self.window): value})

    def shared_by(self, kind: type) -> Any:
        """What :meth:`sharing` holds for ``kind`` at this plan's window."""
        return self.shared[(kind, self.window)]

    def masked(self, bias: torch.Tensor) -> torch.Tensor:
        """``M + B`` as a float tensor, for a score bias ``B`` ``[B|1, H, Lq, Lk]``: in the
        scores' dtype, -inf where the mask ``M`` blocks."""
        bias = bias.to(self.dtype)
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
    """The plan of a pass over ``input_ids``, ``key_mask`` (True = real token), ``segments``
    (each token's document), all ``[B, T]``, and ``cache`` (whose newest slots these tokens took);
    ``kernel`` replaces ``config.kernel``; ``causal=False``: every query reads every key."""
    (B, T), device = input_ids.shape, input_ids.device
    first = 0  # the new tokens' first slot
    if cache is not None:  # each row counting on from its own real tokens
        first, dense, dense_keys = cache.start, cache.positions, cache.key_positions
        key_mask = cache.key_mask  # (B, capacity)
        causal = causal and T > 1  # one new query: the filled slots are what it may read
    elif segments is not None:
        dense = dense_keys = positions_from_segments(segments)
    elif key_mask is not None:
        dense = dense_keys = positions_from_mask(key_mask)
    else:
        dense = dense_keys = torch.arange(T, device=device)
    positions, key_positions, limit = dense, dense_keys, first + T  # windows read dense ones
    drawn = training or config.random_positions_eval  # (model.random_positions_eval)
    if drawn and cache is None and config.random_positions is not None:  # Ruoss et al.
        limit = config.random_positions
        positions = key_positions = random_positions(B, T, limit, key_mask, segments, device)
    windows = sorted(set(config.layer_windows) - {None})
    windows = [None, *windows] if None in config.layer_windows else windows
    masked = key_mask is not None or segments is not None or windows != [None]
    biased = not set(config.layer_positions).isdisjoint(SCORE_BIASES)
    chosen = choose_kernel(
        kernel or config.kernel, config, device, masked or biased, cache, training
    )
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    views = {}
    for window in windows:  # what each window's layers read: a mask in the kernel's form
        if chosen == "sdpa" and causal and not (masked or biased):  # SDPA's own causal path
            views[window] = dict(is_causal=True, mask=None, no_keys=None)
        else:
            views[window] = mask_view(
                chosen, causal, key_mask, segments, first, dense, dense_keys, window
            )
        if config.normalize == "ssmax":
            views[window]["keys_read"] = keys_read(dense, window, causal or cache is not None)
    at = dict(window=windows[0], views=views, **views[windows[0]])  # the first window's view
    return Plan(positions, key_positions, limit, B, config.n_head, chosen, dtype=dtype, **at)


def mask_view(
    kernel: str,
    causal: bool,
    key_mask: torch.Tensor | None,
    segments: torch.Tensor | None,
    first: int,
    positions: torch.Tensor,
    key_positions: torch.Tensor,
    window: int | None,
) -> dict[str, Any]:
    """``mask``, ``no_keys`` and ``is_causal`` of the layers of one window, in ``kernel``'s
    form: a block mask (flex), or a boolean tensor (:func:`lm.model.masks.allowed_keys`).
    ``positions`` and ``key_positions`` count real tokens, which a window measures."""
    T, device = positions.shape[-1], positions.device
    if kernel == "flex":
        mask = flex_block_mask(key_mask, segments, causal, T, device, window, positions)
        return dict(is_causal=False, mask=mask, no_keys=None)
    Lk = key_positions.shape[-1]
    mask, no_keys = allowed_keys(
        key_mask, segments, causal, T, Lk, first, device, window, positions, key_positions
    )
    return dict(is_causal=False, mask=mask, no_keys=no_keys)


def keys_read(dense: torch.Tensor, window: int | None, causal: bool) -> torch.Tensor:
    """SSMax's n, ``[B|1, 1, T, 1]``: the real keys up to each query (all T without the causal
    order), within the window."""
    T = dense.shape[-1]
    read = (dense + 1) if causal else dense.new_full(dense.shape, T)
    read = read if window is None else read.clamp(max=window)
    return read.view(-1, 1, T, 1)
