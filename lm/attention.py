"""Attention exactly as the notes write it ("Attention and Position", sections 1-3 and the
padding-mask detail).

    S = Q K^T / sqrt(d_k),    A = softmax_row(S + M),    Y = A V

Rows are queries, columns are keys. Masks come in two spellings, both broadcastable to
``[..., Lq, Lk]``: additive floats (0 = allowed, -inf = blocked, as the notes draw the causal
mask) or booleans (True = may attend). A query row whose every key is blocked (left padding makes
such rows) gets all-zero weights and a zero output, never NaN.

``MultiHeadAttention`` has three kernels, held equal to float tolerance by the tests, masks
included:

- ``sdpa`` (default): ``torch.nn.functional.scaled_dot_product_attention``. Plain causal
  attention takes its mask-free causal path (flash on GPUs). Document masks, padding and ALiBi
  need a mask: in a model compiled for a GPU they go through FlexAttention (``flex``, below),
  whose kernels skip wholly blocked blocks; otherwise one ``[B, 1|H, T, T]`` mask is built per
  forward pass and shared by every layer.
- ``flex``: ``torch.nn.attention.flex_attention`` for every self-attention pass without a KV
  cache, masks and the ALiBi bias given as functions of (batch, head, query, key), so no
  ``T x T`` tensor exists. Run eagerly, the attention call alone is compiled. On CPU, PyTorch's
  FlexAttention has no backward pass: training there uses SDPA's masks.
- ``math``: this module's explicit ``attention``, the notes' formula; it also returns ``A``.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from lm.position import Rope, alibi_bias, alibi_slopes, rotate_pairs

try:  # PyTorch >= 2.5; without it, masks and biases go through SDPA as tensors
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - the pinned PyTorch has it
    create_block_mask = flex_attention = None

FLEX_AVAILABLE = flex_attention is not None


def causal_mask(L: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The notes' additive causal mask ``[L, L]``: 0 on and below the diagonal, -inf above."""
    blocked = torch.ones(L, L, dtype=torch.bool, device=device).triu(diagonal=1)
    return torch.zeros(L, L, device=device).masked_fill(blocked, float("-inf"))


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, written out: returns ``(Y, A)``.

    q ``[..., Lq, d_k]``, k ``[..., Lk, d_k]``, v ``[..., Lk, d_v]``; ``mask`` additive (float)
    or boolean (True = may attend). Softmax subtracts each row's maximum first: the weights are
    unchanged and large scores cannot overflow ``exp``.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Lq, Lk)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    row_max = scores.amax(dim=-1, keepdim=True)
    # A row with every key blocked has max -inf; shifting by 0 keeps exp() at exactly 0 there.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    total = e.sum(dim=-1, keepdim=True)
    weights = e / torch.where(total > 0, total, torch.ones_like(total))
    return weights @ v, weights


class LayerKVCache:
    """Keys and values of one layer for incremental decoding, preallocated to ``capacity`` slots.

    Keys are stored after RoPE, so each cached key keeps the rotation of its own position.
    Attention always reads every slot (unfilled ones masked), and new keys are written at a
    device-side slot index: a one-token step has the same shapes and no host-side slicing at
    every step, so it can be compiled or captured as a CUDA graph.
    """

    def __init__(
        self,
        batch: int,
        n_head: int,
        capacity: int,
        head_dim: int,
        like: torch.Tensor,
        dtype: torch.dtype | None = None,
    ):
        shape = (batch, n_head, capacity, head_dim)
        dtype = dtype or like.dtype
        self.k = torch.zeros(shape, dtype=dtype, device=like.device)
        self.v = torch.zeros(shape, dtype=dtype, device=like.device)
        self.length = 0  # slots filled (host bookkeeping); only append() moves it
        self._slot = torch.arange(capacity, device=like.device)  # (capacity,)
        self._next = torch.zeros((), dtype=torch.long, device=like.device)  # first free slot

    def append(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store ``k, v [B, H, L, d]`` in the next L slots. Returns every slot's keys and values
        ``[B, H, capacity, d]`` and which slots are filled, ``[capacity]`` (True = filled)."""
        end = self.length + k.shape[2]
        if end > self.k.shape[2]:
            raise ValueError(f"KV cache holds {self.k.shape[2]} slots; {end} requested")
        slots = self._next + self._slot[: k.shape[2]]  # (L,) on the device
        self.k.index_copy_(2, slots, k.to(self.k.dtype))
        self.v.index_copy_(2, slots, v.to(self.v.dtype))
        self._next += k.shape[2]
        self.length = end
        return self.k, self.v, self._slot < self._next


class MultiHeadAttention(nn.Module):
    """``Y = Concat(Y_1, ..., Y_b) W_O^T``, per-head ``W_Q, W_K, W_V`` (notes, "Multiple heads").

    The per-head projections are stored stacked in one ``[3 d, d]`` matrix: rows ``h d_k ...
    (h+1) d_k`` of the first third are head h's ``W_Q`` (then ``W_K``, then ``W_V``). That is the
    same math as separate matrices, done as one matmul.

    Constructed with only ``(d_model, n_head)`` it uses no position scheme. With
    ``position="rope"`` it rotates queries and keys (never values) at their positions, as
    ``rope`` says (default: the notes' RoPE); with ``"alibi"`` it adds the distance bias to the
    scores. Other schemes act on the embeddings.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        position: str = "none",
        rope: Rope | None = None,
        kernel: str = "sdpa",
        dropout: float = 0.0,
        bias: bool = False,
    ):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} is not divisible by n_head={n_head}")
        if kernel not in ("sdpa", "flex", "math"):
            raise ValueError(f"kernel must be sdpa, flex or math, got {kernel!r}")
        if kernel == "flex" and not FLEX_AVAILABLE:
            raise ValueError(f"kernel flex needs PyTorch 2.5 or later, not {torch.__version__}")
        self.d_model, self.n_head, self.head_dim = d_model, n_head, d_model // n_head
        self.position, self.kernel, self.dropout = position, kernel, dropout
        self.rope = (rope or Rope(self.head_dim)) if position == "rope" else None
        if self.rope is not None and self.rope.head_dim != self.head_dim:
            raise ValueError(f"rope is for heads of {self.rope.head_dim}, not {self.head_dim}")
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)  # W_O
        if position == "alibi":
            self.register_buffer("slopes", alibi_slopes(n_head), persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        causal: bool = False,
        *,
        positions: torch.Tensor | None = None,
        key_positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
        rope_angles: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: LayerKVCache | None = None,
        need_weights: bool = False,
        shared: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``x [B, Lq, d]`` to ``context [B, Lc, d]`` (itself when None).

        ``key_mask [B, Lc]`` is True at real keys (with a cache: ``[B, capacity]``, every slot;
        left out, the cache's filled slots); ``causal`` blocks keys in later slots (with a cache,
        the new queries follow the cached slots). ``positions``/``key_positions`` (``[L]`` or
        ``[B, L]``) place queries and keys for rope/alibi, default ``0..L-1``; ``rope_angles``
        may carry precomputed ``(cos, sin)`` for both. ``segments [B, L]`` (self-attention) gives
        each token's document: a query reads keys of its own document only. ``mask`` is any
        further boolean mask, broadcastable to ``[B, H, Lq, Lc]``. ``shared`` is a dict the layers
        of one forward pass share (they must have the same inputs but for ``x``): the first stores
        the masks and score bias it builds, the others reuse them. Returns ``(y [B, Lq, d],
        weights [B, H, Lq, Lc] or None)``.
        """
        if segments is not None and (context is not None or cache is not None):
            raise ValueError("segments are for self-attention without a KV cache")
        q, k, v = self._project(x, context)  # (B, H, Lq, d_k), (B, H, Lc, d_k), (B, H, Lc, d_k)

        # Place: new keys sit where their tokens sit, with the queries or at 0..Lc-1 in a context.
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + q.shape[2], device=x.device)
        new_key_positions = (
            positions if context is None else torch.arange(k.shape[2], device=x.device)
        )
        if key_positions is None:
            if cache is not None and self.position == "alibi":
                raise ValueError("with a cache, pass key_positions for every cache slot")
            key_positions = new_key_positions
        if self.rope is not None and rope_angles is not None and context is None:
            q, k = (rotate_pairs(t, *rope_angles) for t in (q, k))  # cos, sin at these positions
        elif self.rope is not None:
            q, k = self.rope.apply(q, positions), self.rope.apply(k, new_key_positions)

        causal_from = None  # slot of the first query; None: the queries fill the last slots
        if cache is not None:
            k, v, filled = cache.append(k, v)  # (B, H, capacity, d_k): every slot, filled or not
            if key_mask is None:
                key_mask = filled.expand(q.shape[0], -1)  # (B, capacity)
            # One new query: the filled-slot mask already hides every later slot.
            causal, causal_from = causal and q.shape[2] > 1, past

        explicit = self.kernel == "math" or need_weights
        if self._flex_ready(q, context, cache, mask, explicit, (key_mask, segments)):
            y, weights = self._flex(q, k, v, key_mask, segments, causal, positions, shared), None
        else:
            which = (mask, key_mask, segments, causal)
            where = (positions, key_positions, causal_from)
            y, weights = self._tensor_masked(q, k, v, which, where, explicit, shared)
        y = y.transpose(1, 2).flatten(2)  # (B, Lq, d): heads concatenated
        return self.out(y), weights

    def _tensor_masked(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        which: tuple,
        where: tuple[torch.Tensor, torch.Tensor, int | None],
        explicit: bool,
        shared: dict | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """SDPA or the explicit formula, masks as tensors. ``which`` is ``(mask, key_mask,
        segments, causal)``. Every layer of one forward pass has the same masks and ALiBi bias:
        the first layer builds them, the others reuse them."""
        mask, key_mask, segments, causal = which
        masks = shared.get("masks") if shared is not None else None
        if masks is None:
            if segments is not None:  # (B, 1, L, L): True where query and key share a document
                mask = _and(mask, (segments[:, :, None] == segments[:, None, :])[:, None])
            masks = self._masks(q, k, mask, key_mask, causal, where, explicit)
            if shared is not None:
                shared["masks"] = masks
        allowed, empty, kernel_causal = masks
        y, weights = self._attend(q, k, v, allowed, kernel_causal, explicit)  # (B, H, Lq, d_k)
        if empty is not None:  # a query with no key to read gets a zero output, never NaN
            y = y.masked_fill(empty, 0.0)
            weights = None if weights is None else weights.masked_fill(empty, 0.0)
        return y, weights

    def _flex_ready(
        self,
        q: torch.Tensor,
        context: torch.Tensor | None,
        cache: LayerKVCache | None,
        mask: torch.Tensor | None,
        explicit: bool,
        masked_by: tuple,
    ) -> bool:
        """Whether this pass goes through FlexAttention: self-attention without a cache, a
        further mask tensor or attention dropout (flex has none), and not needing gradients on
        CPU, where FlexAttention has no backward pass; with ``kernel="sdpa"``, only on a GPU
        under ``torch.compile`` and only when there is a mask or a bias to apply."""
        if self.kernel == "math" or explicit or not FLEX_AVAILABLE:
            return False
        if context is not None or cache is not None or mask is not None:
            return False
        if self.training and self.dropout > 0:
            return False
        if not flex_backward(q.device) and torch.is_grad_enabled():
            return False  # PyTorch's FlexAttention has no backward pass on CPU
        if self.kernel == "flex":
            return True
        # sdpa picks flex inside a compiled CUDA graph only: on CPU, FlexAttention measured no
        # faster than SDPA with a mask (README, "Masked attention") and has no backward pass.
        needs_mask = self.position == "alibi" or any(t is not None for t in masked_by)
        return needs_mask and q.device.type == "cuda" and torch.compiler.is_compiling()

    def _flex(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_mask: torch.Tensor | None,
        segments: torch.Tensor | None,
        causal: bool,
        positions: torch.Tensor,
        shared: dict | None,
    ) -> torch.Tensor:
        """``softmax(S + M) V`` by FlexAttention: M as a block mask (blocks wholly blocked are
        skipped) and ALiBi as a score function; nothing ``T x T`` is built. Both are made once
        per forward pass and shared by the layers."""
        parts = shared.get("flex") if shared is not None else None
        if parts is None:
            slopes = self.slopes if self.position == "alibi" else None
            parts = _flex_parts(q, key_mask, segments, causal, positions, slopes)
            if shared is not None:
                shared["flex"] = parts
        block_mask, score_mod = parts
        attend = flex_attention if torch.compiler.is_compiling() else _compiled_flex()
        return attend(q, k, v, score_mod=score_mod, block_mask=block_mask)

    def _masks(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        mask: torch.Tensor | None,
        key_mask: torch.Tensor | None,
        causal: bool,
        where: tuple[torch.Tensor, torch.Tensor, int | None],
        explicit: bool,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
        """What the kernel gets: the mask (boolean, or additive with the ALiBi bias added;
        broadcastable to ``[B, H, Lq, Lk]``; None: none), the rows left with no key (or None),
        and whether the kernel's own causal path replaces a mask tensor."""
        positions, key_positions, causal_from = where
        Lq, Lk = q.shape[2], k.shape[2]
        if key_mask is not None:
            mask = _and(mask, key_mask[:, None, None, :])  # (B, 1, 1, Lk): same for every query
        # The common training case needs no mask tensor at all: the kernel's own causal path.
        kernel_causal = causal and Lq == Lk and mask is None and not explicit
        kernel_causal = kernel_causal and self.position != "alibi"
        allowed, empty = _allowed(mask, causal and not kernel_causal, Lq, Lk, q.device, causal_from)
        bias = None
        if self.position == "alibi":
            bias = alibi_bias(self.slopes, positions, key_positions).to(q.dtype)  # (B|1, H, Lq, Lk)
        if explicit or bias is not None:  # additive: -inf where blocked, plus the bias
            allowed = _float_mask(allowed, bias, q.dtype)
        return allowed, empty, kernel_causal

    def _project(self, x: torch.Tensor, context: torch.Tensor | None) -> list[torch.Tensor]:
        """``Q = X W_Q^T``, ``K = C W_K^T``, ``V = C W_V^T`` (``C = X`` unless cross-attention)."""
        d = self.d_model
        if context is None:
            qkv = self.qkv(x).split(d, dim=-1)  # (B, L, d) each, from one matmul
        else:
            w, b = self.qkv.weight, self.qkv.bias
            q = F.linear(x, w[:d], None if b is None else b[:d])
            qkv = (q, *F.linear(context, w[d:], None if b is None else b[d:]).split(d, dim=-1))
        return [t.unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2) for t in qkv]

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
        explicit: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``Y = softmax(S + M) V``, written out (it also returns ``A``) or by the fused kernel;
        dropout acts on the weights ``A`` in both."""
        dropout = self.dropout if self.training else 0.0
        if not explicit:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal
            )
            return y, None
        y, weights = attention(q, k, v, mask)
        if dropout:
            y = F.dropout(weights, dropout) @ v
        return y, weights


def _allowed(
    mask: torch.Tensor | None,
    causal: bool,
    Lq: int,
    Lk: int,
    device: torch.device,
    first: int | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Which keys each query may read (boolean, broadcastable to ``[B, H, Lq, Lk]``; None: all),
    and the rows a ``mask`` left with none (``[..., Lq, 1]``), which read every key so that the
    kernel stays finite and are zeroed afterwards. The queries sit in slots ``first ...``
    (default: the last Lq slots)."""
    allowed = mask
    first = Lk - Lq if first is None else first
    if causal and not (Lq == 1 and first == Lk - 1 and mask is None):  # last query: every key
        # Query i reads keys up to slot first + i.
        allowed = _and(mask, torch.ones(Lq, Lk, dtype=torch.bool, device=device).tril(first))
    if mask is None:
        return allowed, None  # causality alone leaves every query its own key
    empty = ~allowed.any(dim=-1, keepdim=True)
    return allowed | empty, empty


def _and(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else a & b


def _float_mask(
    allowed: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """One additive mask from a boolean one and an optional score bias (-inf where blocked)."""
    if allowed is None:
        return bias
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    blocked = blocked.masked_fill(~allowed, float("-inf"))
    return blocked if bias is None else blocked + bias


def _flex_parts(
    q: torch.Tensor,
    key_mask: torch.Tensor | None,
    segments: torch.Tensor | None,
    causal: bool,
    positions: torch.Tensor,
    slopes: torch.Tensor | None,
) -> tuple:
    """FlexAttention's block mask for these masks (None: every key allowed) and, given ALiBi's
    ``slopes``, its score function (else None)."""
    B, L = q.shape[0], q.shape[2]

    def allowed(b, h, qi, ki):  # True where query qi may read key ki
        ok = qi >= ki if causal else qi == qi
        if segments is not None:
            ok = ok & (segments[b, qi] == segments[b, ki])
        if key_mask is not None:
            ok = ok & key_mask[b, ki]
        return ok

    block_mask = None
    if causal or segments is not None or key_mask is not None:
        per_row = segments is not None or key_mask is not None
        block_mask = create_block_mask(allowed, B if per_row else None, None, L, L, q.device)
    if slopes is None:
        return block_mask, None
    pos = positions if positions.dim() == 2 else positions[None].expand(B, -1)  # (B, L)
    # fp32 whatever q's dtype: flex scores in fp32, and a bf16 bias would be off by up to 1/256
    # of m_h |pos_q - pos_k| (SDPA's additive mask must take q's dtype).
    m = slopes.float()

    def alibi(score, b, h, qi, ki):  # - m_h |pos_q - pos_k|
        return score - m[h] * (pos[b, qi] - pos[b, ki]).abs()

    return block_mask, alibi


def flex_backward(device: torch.device) -> bool:
    """Whether PyTorch's FlexAttention has a backward pass on this device (not on CPU)."""
    return device.type != "cpu"


@functools.cache
def _compiled_flex():
    """``flex_attention`` compiled on its own, for a model that is not: PyTorch's eager
    FlexAttention is a reference that builds every score, slower than SDPA with a mask. Shapes
    are static (one compilation per length): Inductor's CPU code for dynamic shapes fails to
    build in PyTorch 2.13."""
    return torch.compile(flex_attention, dynamic=False)
