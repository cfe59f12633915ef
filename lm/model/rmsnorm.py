"""RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4): each vector
divided by its root mean square, then scaled by a learned gain,

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g

with no mean subtracted and no bias. The Llama-style block's norm (``model.norm: rmsnorm``) and
QK-norm's, over each head's query and key (``model.qk_norm``; Qwen3, OLMo 2).
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * g`` over the last dimension, of width ``width``.

    The root mean square is taken in float32 whatever ``x``'s precision (as Llama's and Qwen3's
    reference code does), and the result keeps ``x``'s dtype, so that bf16 queries stay bf16.
    Written as plain ops: autograd sums the gain's gradient the same way on any number of CPU
    threads (see ``lm.model.transformer.LayerNorm``)."""

    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))  # g
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
