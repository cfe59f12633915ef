"""PoPE, Polar Coordinate Position Embeddings (Gopalakrishnan, Csordás, Schmidhuber and Mozer
2025, "Decoupling the 'What' and 'Where' With Polar Coordinate Positional Embeddings", arXiv
2509.10534, section 3).

RoPE rotates a pair of features whose own angle already carries content, so a query-key score
mixes the two ("what" and "where"). PoPE gives each of a head's ``d`` features one complex
number whose magnitude is content alone and whose phase is position alone:

    q~_tc = softplus(q_tc) e^(i t theta_c),   k~_sc = softplus(k_sc) e^(i (s theta_c + delta_c)),
    score_ts = Re[q~_t^H k~_s] = sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_c)

with ``d`` frequencies ``theta_c = base^(-c/d)``, ``c = 0 .. d-1`` (twice RoPE's ``d/2``, spaced
as finely), and a learned phase offset ``delta_c`` per head and frequency, starting at 0.

In ``lm``: the complex numbers are written as real features, ``[mu cos phi, mu sin phi]``, so a
head's queries and keys are ``2 d`` wide and every kernel (and the KV cache, which keeps the keys at
that width) computes the score as a dot product; the queries carry a factor ``sqrt 2`` so that the
kernels' ``1/sqrt(2 d)`` is the paper's ``1/sqrt(d)``. Queries and keys wider than the values send
PyTorch's SDPA down its math path, so on CPU training takes the notes' formula (its row's
``wide_keys``: ``lm.model.kernels``). The offset is unclamped (a phase is periodic). The paper
adds it to the key's phase; ``lm`` subtracts it from the query's, the same score, so that with
grouped-query attention each query head keeps its own offsets while the key heads it shares
stay free of them. ``theta`` uses ``model.rope_base`` (10000, the paper's).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lm.config.sections import ModelConfig
from lm.model.masks import Positions
from lm.model.schemes.base import Scheme


def pope_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """``theta_c = base^(-c/d)`` for each of a head's ``d`` features, float64 ``[d]``."""
    return base ** (-torch.arange(head_dim, dtype=torch.float64) / head_dim)


def polar(magnitude: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``[mu cos phi, mu sin phi]`` ``[..., L, 2 d]``: the complex numbers ``mu e^(i phi)`` of
    ``magnitude [..., L, d]`` and the phases' cos and sin ``[..., L, d]`` as real features."""
    return torch.cat([magnitude * cos, magnitude * sin], dim=-1)


class PoPE(Scheme):
    """PoPE: each query and key feature becomes ``softplus(x) e^(i phase)``, the phase
    ``position * theta_c`` (less the query head's learned offset ``delta_c``), the score the
    real part of their Hermitian product (module docstring). Queries and keys leave ``2 d_k``
    wide."""

    name = "pope"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        self.register_buffer(
            "theta", pope_frequencies(config.head_dim, config.rope_base), persistent=False
        )
        self.offset = nn.Parameter(torch.zeros(config.n_head, config.head_dim))  # delta_hc

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, where: Positions
    ) -> tuple[torch.Tensor, torch.Tensor]:
        angles = where.queries.to(torch.float64)[..., None] * self.theta  # (..., L, d)
        cos, sin = torch.cos(angles), torch.sin(angles)  # (B|1, L, d) or (L, d), float64
        if cos.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, L, d): across the heads
        delta = self.offset.double()[:, None, :]  # (H, 1, d)
        # The score reads the phase difference (s - t) theta + delta, so the offset may sit on
        # either side: on the query's, t theta - delta, a key head shared by a group of query
        # heads (model.n_kv_head) is one position's alone. cos and sin of the difference, float64.
        cos_q = cos * torch.cos(delta) + sin * torch.sin(delta)
        sin_q = sin * torch.cos(delta) - cos * torch.sin(delta)
        work = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
        mu_q, mu_k = F.softplus(q.to(work)), F.softplus(k.to(work))
        q_out = polar(mu_q * math.sqrt(2.0), cos_q.to(work), sin_q.to(work))
        k_out = polar(mu_k, cos.to(work), sin.to(work))
        return q_out.to(q.dtype), k_out.to(k.dtype)
