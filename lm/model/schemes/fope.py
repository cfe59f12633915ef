"""FoPE, Fourier Position Embedding (Hua et al. 2025, "Fourier Position Embedding: Enhancing
Attention's Periodic Extension for Length Generalization", ICML 2025, arXiv 2412.17739,
section 4).

RoPE multiplies pair ``m`` of a query or key at position ``n`` by one wave, ``e^(i omega_m n)``.
The paper argues that the linear layers and activations around attention leak other frequencies
into every pair, and that frequencies too low to complete a period within the trained length are
never trained whole. FoPE answers both:

- each pair is multiplied by a Fourier series over all of the head's frequencies,
  ``f_m(n) = sum_w a_mw e^(i omega_w n)``, with ``a_mm = 1`` and the other coefficients drawn
  from ``N(0, sigma^2)``, per head, ``sigma`` = :data:`SIGMA`;
- every frequency below the floor ``2 pi / L`` (``L`` the trained context, ``model.context_length``
  or ``model.random_positions``) is clipped to 0, so it carries no position at all.

In ``lm``: the coefficients are drawn once at initialisation (from the run's seed) and fixed, kept
in the checkpoint; the paper's code can also learn them, and can give the sines and cosines
separate coefficients, which ``lm`` does not. With grouped-query attention
(``model.n_kv_head``) a series belongs to a key/value head, and the query heads of its group
share it. The series' cos and sin take the place of RoPE's (``rotate_pairs``), so a pair is
scaled as well as turned, and a score is no longer a function of the offset alone: that is the
paper's choice. Pairs are RoPE's interleaved ones; the paper's code
uses halves, the same computation up to the order of the features.
"""

from __future__ import annotations

import math

import torch

from lm.config.sections import ModelConfig
from lm.model.kernels import per_query_head
from lm.model.masks import Positions
from lm.model.schemes.base import Scheme
from lm.model.schemes.rope import rope_frequencies, rotate_pairs

SIGMA = 0.3
"""The spread of the coefficients of the other frequencies (the paper treats it as a setting)."""


def fope_frequencies(head_dim: int, base: float, context: int) -> torch.Tensor:
    """RoPE's ``omega_m = base^(-2m/d)`` with every one below ``2 pi / context`` (less than one
    period over the trained positions) clipped to 0, float64 ``[d/2]``."""
    omega = rope_frequencies(head_dim, base)
    return torch.where(omega < 2 * math.pi / context, torch.zeros_like(omega), omega)


def fourier_coefficients(heads: int, pairs: int, sigma: float) -> torch.Tensor:
    """``a [H, d/2, d/2]``: row m holds pair m's coefficient of each frequency, 1 for its own and
    ``N(0, sigma^2)`` for the others (drawn from torch's generator)."""
    a = torch.randn(heads, pairs, pairs, dtype=torch.float64) * sigma
    eye = torch.eye(pairs, dtype=torch.bool)
    return torch.where(eye, torch.ones_like(a), a)


class FoPE(Scheme):
    """FoPE: pair m of every query and key at position n multiplied by the complex number
    ``sum_w a_hmw e^(i omega_w n)`` of its head ``h`` (module docstring). Each layer mixes
    the waves of the positions by its own coefficients."""

    name = "fope"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        omega = fope_frequencies(config.head_dim, config.rope_base, config.position_range)
        self.register_buffer("omega", omega, persistent=False)
        # A series per key/value head (model.n_kv_head), which the query heads of its group
        # share: the paper's one per head where each query head has its own keys.
        coefficients = fourier_coefficients(config.kv_heads, config.head_dim // 2, SIGMA)
        self.register_buffer("coefficients", coefficients.float())  # saved: drawn, not derived

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, where: Positions
    ) -> tuple[torch.Tensor, torch.Tensor]:
        angles = where.queries.to(torch.float64)[..., None] * self.omega  # n omega_w
        cos, sin = torch.cos(angles), torch.sin(angles)  # (B|1, L, d/2) or (L, d/2), float64
        if cos.dim() == 2:
            cos, sin = cos[None], sin[None]
        a = self.coefficients.double()  # (H_kv, d/2 pairs m, d/2 frequencies w)
        # Re and Im of sum_w a_mw e^(i omega_w n): (B|1, H_kv, L, d/2)
        series_cos = torch.einsum("bnw,hmw->bhnm", cos, a).float()
        series_sin = torch.einsum("bnw,hmw->bhnm", sin, a).float()
        q_cos, q_sin = (per_query_head(t, q.shape[1]) for t in (series_cos, series_sin))
        return rotate_pairs(q, q_cos, q_sin), rotate_pairs(k, series_cos, series_sin)
