"""Attention exactly as the notes write it ("Attention and Position", sections 1-3 and the
padding-mask detail).

    S = Q K^T / sqrt(d_k),    A = softmax_row(S + M),    Y = A V

Rows are queries, columns are keys. Masks come in two spellings, both broadcastable to
``[..., Lq, Lk]``: additive floats (0 = allowed, -inf = blocked, as the notes draw the causal
mask) or booleans (True = may attend). A query row whose every key is blocked (left padding makes
such rows) gets all-zero weights and a zero output, never NaN.

``MultiHeadAttention`` has a fused path (``torch.nn.functional.scaled_dot_product_attention``,
the default, fast) and this module's explicit ``attention`` (``kernel="math"``); tests hold the
two equal to float tolerance, masks included.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lm.position import Rope, alibi_bias, alibi_slopes, rotate_pairs


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
    """

    def __init__(self, batch: int, n_head: int, capacity: int, head_dim: int, like: torch.Tensor):
        shape = (batch, n_head, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=like.dtype, device=like.device)
        self.v = torch.zeros(shape, dtype=like.dtype, device=like.device)
        self.length = 0  # slots filled; only append() moves it

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v [B, H, L, d]`` after the cached slots; return all keys and values so far."""
        end = self.length + k.shape[2]
        if end > self.k.shape[2]:
            raise ValueError(f"KV cache holds {self.k.shape[2]} slots; {end} requested")
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


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
        if kernel not in ("sdpa", "math"):
            raise ValueError(f"kernel must be sdpa or math, got {kernel!r}")
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
        rope_angles: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: LayerKVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``x [B, Lq, d]`` to ``context [B, Lc, d]`` (itself when None).

        ``key_mask [B, Lc]`` is True at real keys; ``causal`` blocks keys in later slots (with a
        cache, the new queries follow the cached slots). ``positions``/``key_positions`` (``[L]`` or
        ``[B, L]``) place queries and keys for rope/alibi, default ``0..L-1``; ``rope_angles`` may
        carry precomputed ``(cos, sin)`` for both. ``mask`` is any further boolean mask,
        broadcastable to ``[B, H, Lq, Lc]``. Returns ``(y [B, Lq, d], weights [B, H, Lq, Lc]
        or None)``.
        """
        q, k, v = self._project(x, context)  # (B, H, Lq, d_k), (B, H, Lc, d_k), (B, H, Lc, d_k)

        # Place: new keys sit where their tokens sit, with the queries or at 0..Lc-1 in a context.
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + q.shape[2], device=x.device)
        new_key_positions = (
            positions if context is None else torch.arange(k.shape[2], device=x.device)
        )
        if key_positions is None:
            if past and self.position == "alibi":
                raise ValueError("with a filled cache, pass key_positions for every cached key")
            key_positions = new_key_positions
        if self.rope is not None and rope_angles is not None and context is None:
            q, k = (rotate_pairs(t, *rope_angles) for t in (q, k))  # cos, sin at these positions
        elif self.rope is not None:
            q, k = self.rope.apply(q, positions), self.rope.apply(k, new_key_positions)

        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, Lk, d_k): the cached keys, then the new ones

        # Mask: which keys each query may read, then the score bias (ALiBi).
        Lq, Lk = q.shape[2], k.shape[2]
        if key_mask is not None:
            mask = _and(mask, key_mask[:, None, None, :])  # (B, 1, 1, Lk): same for every query
        explicit = self.kernel == "math" or need_weights
        # The common training case needs no mask tensor at all: the kernel's own causal path.
        kernel_causal = causal and Lq == Lk and mask is None and not explicit
        kernel_causal = kernel_causal and self.position != "alibi"
        allowed, empty = _allowed(mask, causal and not kernel_causal, Lq, Lk, x.device)
        bias = None
        if self.position == "alibi":
            bias = alibi_bias(self.slopes, positions, key_positions).to(q.dtype)  # (B|1, H, Lq, Lk)
        if explicit or bias is not None:  # additive: -inf where blocked, plus the bias
            allowed = _float_mask(allowed, bias, q.dtype)

        y, weights = self._attend(q, k, v, allowed, kernel_causal, explicit)  # (B, H, Lq, d_k)
        if empty is not None:  # a query with no key to read gets a zero output, never NaN
            y = y.masked_fill(empty, 0.0)
            weights = None if weights is None else weights.masked_fill(empty, 0.0)
        y = y.transpose(1, 2).flatten(2)  # (B, Lq, d): heads concatenated
        return self.out(y), weights

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
    mask: torch.Tensor | None, causal: bool, Lq: int, Lk: int, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Which keys each query may read (boolean, broadcastable to ``[B, H, Lq, Lk]``; None: all),
    and the rows a ``mask`` left with none (``[..., Lq, 1]``), which read every key so that the
    kernel stays finite and are zeroed afterwards."""
    allowed = mask
    if causal and not (Lq == 1 and mask is None):  # a lone last query may read every key
        # The queries occupy the last Lq slots: query i reads keys up to slot Lk - Lq + i.
        allowed = _and(mask, torch.ones(Lq, Lk, dtype=torch.bool, device=device).tril(Lk - Lq))
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
