"""Position as a bias on the scores that depends on the layer's content, not only on where tokens
sit: FoX's forget gates read each token's input, CoPE's gates read the query-key scores. Both
count for each query how much lies between it and each key, and both learn what to count.
They use the ``score_bias`` hook's ``x``, ``q`` and ``k``."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lm.config.sections import ModelConfig
from lm.model.cache import KVCache
from lm.model.kernels import per_query_head
from lm.model.masks import Mask, Positions
from lm.model.schemes.base import Scheme


class FoX(Scheme):
    """The Forgetting Transformer (Lin et al. 2025, "Forgetting Transformer: Softmax Attention
    with a Forget Gate", ICLR 2025, arXiv 2503.02130, eqs. 3-5): each head computes a forget gate
    ``f_t = sigma(w_f . x_t + b_f)`` of every token's input and adds to the score of query i and
    key j the log of what the tokens after j forget, ``D_ij = sum_{l=j+1..i} log f_l``: a decay
    that each token's content sets, and the only position signal. With ``c_t = sum_{l<=t} log
    f_l``, ``D_ij = c_i - c_j``; the KV cache keeps every key's ``c`` and each row's running sum
    (``KVCache.cumulative``). The gate is a ``Linear(d_model, n_head)`` with a bias, as the
    paper's "full" gate, starting as lm's linear layers do (``f`` near 1/2). Padding on the left
    or right lies before or after every pair of real tokens, so its gates never enter a real
    query's bias."""

    name = "fox"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        self.layer = layer or 0  # its slot in a KV cache
        self.gate = nn.Linear(config.d_model, config.n_head, bias=True)

    def log_forget(self, x: torch.Tensor) -> torch.Tensor:
        """``log f_t`` of each token and head, ``[B, H, T]``, in fp32."""
        return F.logsigmoid(self.gate(x).float()).transpose(1, 2)

    def score_bias(
        self,
        where: Positions,
        mask: Mask,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor | Callable:
        log_f = self.log_forget(x)  # (B, H, T)
        if cache is not None:
            queries, keys = cache.cumulative(self.layer, log_f)  # (B, H, T), (B, H, slots)
        else:
            queries = keys = log_f.cumsum(dim=-1)  # c_t
        if mask.kernel == "flex":

            def score_mod(s, b, h, qi, kj):
                return s + queries[b, h, qi] - keys[b, h, kj]

            return score_mod
        return queries[..., :, None] - keys[..., None, :]  # (B, H, Lq, Lk)


class CoPE(Scheme):
    """Contextual Position Encoding (Golovneva et al. 2024, "Contextual Position Encoding:
    Learning to Count What's Important", arXiv 2405.18719, eqs. 3-5): gates ``g_ij = sigma(q_i .
    k_j / sqrt(d_k))`` of the keys a query may read, positions ``p_ij = sum_{t=j..i} g_it`` (how
    much the query counts from key j to itself), and the bias ``q_i . e[p_ij] / sqrt(d_k)``, with
    ``e`` interpolated between ``e[floor p]`` and ``e[ceil p]`` and ``p`` clamped below
    ``model.cope_max``. As the paper's code: one table ``e`` ``[d_k, cope_max]`` per layer shared
    by its heads, starting at zero, and ``q . e[p]`` added before the scores' division by
    ``sqrt(d_k)``. The gates read every key of a query's row, so FlexAttention, which scores one
    pair at a time, cannot run it; the positions are computed in fp32."""

    name = "cope"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        self.table = nn.Parameter(torch.zeros(config.head_dim, config.cope_positions))

    def score_bias(
        self,
        where: Positions,
        mask: Mask,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor | Callable:
        root = math.sqrt(q.shape[-1])
        q32, k = q.float(), per_query_head(k, q.shape[1])  # each query head its group's keys
        gates = torch.sigmoid(q32 @ k.float().transpose(-2, -1) / root)  # (B, H, Lq, Lk)
        if mask.allowed is not None:  # the keys a query may not read count nothing
            gates = gates.masked_fill(~mask.allowed, 0.0)
        top = self.table.shape[1] - 1
        counted = gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=top)  # p_ij
        fixed = q32 @ self.table.float()  # (B, H, Lq, cope_max): q . e[p] at whole p
        low = counted.floor().long()  # (no gradient through the rounding, as the paper)
        high = counted.ceil().long()
        share = counted - low  # differentiable: the interpolation's weight of e[ceil p]
        bias = fixed.gather(-1, high) * share + fixed.gather(-1, low) * (1 - share)
        return bias / root
