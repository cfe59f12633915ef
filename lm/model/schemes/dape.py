"""DAPE, Data-Adaptive Positional Encoding (Zheng et al. 2024, "DAPE: Data-Adaptive Positional
Encoding for Length Extrapolation", NeurIPS 2024, arXiv 2405.14722, section 3).

A static bias ``B`` of distance (KERPLE's or ALiBi's) is the same for every text. DAPE lets the
scores of the text adjust it: a small MLP ``f`` reads, for each query-key pair, the scores of
every head and the static bias of every head, and adds to each head's logit

    A_DAPE = S + B + f([S; B]),   f: R^(2H) -> R^H,  f(z) = W_2 GELU(W_1 z + b_1) + b_2

with ``S = q.k / sqrt(d_k)`` the scores, ``B`` per head, and ``f`` applied pair by pair (so a
query still reads nothing but its own keys: the causal and document masks are applied after).
``model.dape_bias`` picks ``B``: ``kerple`` (the logarithmic kernel with its own learned ``r1, r2``
in each layer, the paper's main setting) or ``alibi`` (fixed slopes). ``f``'s hidden width is
:data:`WIDTH`, the paper's 32.

In ``lm``: ``f``'s activation is GELU, as lm's MLPs; each layer has its own ``f`` and its own
KERPLE ``r``. ``f`` reads every head of one pair at once, which FlexAttention's score function
(one pair and one head at a time) cannot, so ``flex`` is refused. The cost is the MLP over the
``[B, Lq, Lk, 2H]`` scores: ``O(L^2 H WIDTH)`` per layer beside attention's ``O(L^2 H d_k)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lm.config.sections import ModelConfig
from lm.model.cache import KVCache
from lm.model.kernels import per_query_head
from lm.model.masks import Mask, Positions
from lm.model.schemes.base import Scheme
from lm.model.schemes.biases import alibi_slopes, kerple_log, positive

WIDTH = 32
"""The hidden width of DAPE's MLP (the paper's D_DAPE)."""


class DAPE(Scheme):
    """DAPE: the static bias ``B`` (KERPLE's or ALiBi's, ``model.dape_bias``) plus an MLP of
    every head's score and bias at each query-key pair (module docstring)."""

    name = "dape"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        self.heads, self.static = config.n_head, config.dape_bias
        if self.static == "kerple":  # as lm's kerple: U(0, 2) and U(0, 1), kept >= 0.01
            self.r1 = nn.Parameter(torch.rand(config.n_head) * 2)
            self.r2 = nn.Parameter(torch.rand(config.n_head))
        else:
            self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)
        self.mix = nn.Sequential(
            nn.Linear(2 * config.n_head, WIDTH), nn.GELU(), nn.Linear(WIDTH, config.n_head)
        )

    def static_bias(self, where: Positions) -> torch.Tensor:
        """``B`` ``[B|1, H, Lq, Lk]`` in fp32 at the query and key positions ``where``."""
        Lq, Lk = where.queries.shape[-1], where.keys.shape[-1]
        head = torch.arange(self.heads, device=where.queries.device).view(1, -1, 1, 1)
        query = where.queries.view(-1, 1, Lq, 1).float()
        key = where.keys.view(-1, 1, 1, Lk).float()
        if self.static == "kerple":
            return kerple_log(positive(self.r1), positive(self.r2), head, query, key)
        return -self.slopes[head] * (query - key).abs()

    def score_bias(
        self,
        where: Positions,
        mask: Mask,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        k = per_query_head(k, q.shape[1])  # a query head's group's keys
        scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])  # S
        static = self.static_bias(where).expand_as(scores)  # B: (B, H, Lq, Lk)
        pairs = torch.cat([scores, static], dim=1).permute(0, 2, 3, 1)  # (B, Lq, Lk, 2H)
        w1, w2 = self.mix[0], self.mix[2]
        hidden = F.gelu(F.linear(pairs, w1.weight.float(), w1.bias.float()))
        adjust = F.linear(hidden, w2.weight.float(), w2.bias.float()).permute(0, 3, 1, 2)
        return static + adjust  # B + f([S; B]): the kernel adds S and M
