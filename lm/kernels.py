"""``Y = softmax_row(S + M) V``, three ways, held equal to float tolerance by the tests: the
notes' formula written out (:func:`attention`, with the notes' :func:`causal_mask`); SDPA, whose
mask-free causal path is flash attention on GPUs; and FlexAttention, which takes the mask as a
block mask (wholly blocked blocks are skipped) and a score bias as a function of (batch, head,
query, key), so no ``T x T`` tensor exists. Which one runs, and the mask in the form it takes,
is decided once per forward pass (:mod:`lm.plan`).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

try:  # PyTorch >= 2.5; without it, masks and biases go through SDPA as tensors
    from torch.nn.attention.flex_attention import flex_attention
except ImportError:  # pragma: no cover - the pinned PyTorch has it
    flex_attention = None

if TYPE_CHECKING:
    from lm.plan import Bias, Plan

FLEX_AVAILABLE = flex_attention is not None


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


def softmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """``A = softmax_row(S + M)`` from the masked scores, subtracting each row's maximum first:
    the weights are unchanged and large scores cannot overflow ``exp``. A row with every key
    blocked gets all-zero weights, never NaN."""
    row_max = scores.amax(dim=-1, keepdim=True)
    # A row with every key blocked has max -inf; shifting by 0 keeps exp() at exactly 0 there.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, written out: returns ``(Y, A)``.

    q ``[..., Lq, d_k]``, k ``[..., Lk, d_k]``, v ``[..., Lk, d_v]``; ``mask`` additive (float)
    or boolean (True = may attend), broadcastable to ``[..., Lq, Lk]``.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Lq, Lk)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    weights = softmax_rows(scores)
    return weights @ v, weights


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: Plan,
    bias: Bias | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """``Y = softmax(S + M) V`` ``[B, H, Lq, d_v]`` by the plan's kernel, for q ``[B, H, Lq,
    d_k]`` and k, v ``[B, H, Lk, d]``. ``bias`` is a layer's position bias in the form the plan
    made it (an additive mask that holds M too, or a score function); dropout acts on ``A``."""
    if plan.kernel == "flex":
        attend_flex = flex_attention if torch.compiler.is_compiling() else _compiled_flex()
        y = attend_flex(q, k, v, score_mod=bias, block_mask=plan.mask)
    elif plan.kernel == "math":
        y, weights = attention(q, k, v, plan.mask if bias is None else bias)
        if dropout:
            y = F.dropout(weights, dropout) @ v
    else:
        mask = plan.mask if bias is None else bias
        causal = plan.kernel == "causal" and mask is None
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal
        )
    # A query with no key to read (left padding) read every key instead; its output is zero.
    return y if plan.empty is None else y.masked_fill(plan.empty, 0.0)


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
