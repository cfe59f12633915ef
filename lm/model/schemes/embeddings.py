"""Positions added to the token embeddings, below every layer at once (notes, "Additive positions
combine token features and location features"): ``x_l = E[w_l] + p_l`` with the notes' fixed
sinusoids (:func:`sinusoidal_table`) or a learned table (GPT-2)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lm.config.sections import ModelConfig
from lm.model.masks import Positions
from lm.model.schemes.base import PositionOutOfRange, Scheme


def frequencies(
    d: int, base: float = 10000.0, device: torch.device | str | None = None
) -> torch.Tensor:
    """The notes' frequencies ``w_i = base^(-2i/d)``, ``i = 0 .. d/2 - 1``, float64: the
    sinusoids' (and Sandwich's, the inner products of them), and RoPE's ``theta_i``."""
    return base ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d)


def sinusoidal_table(
    length: int,
    d: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The notes' fixed sinusoids, ``[length, d]``: ``p[l, 2i] = sin(l w_i)``, ``p[l, 2i+1] =
    cos(l w_i)``, ``w_i = 10000^(-2i/d)``; ``d`` must be even."""
    if d % 2:
        raise ValueError(f"sinusoidal_table needs an even width, got d={d}")
    positions = torch.arange(length, device=device, dtype=torch.float64)[:, None]  # (L, 1)
    angles = positions * frequencies(d, device=device)  # (L, d/2): column i is l * w_i
    table = torch.empty(length, d, device=device, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.to(dtype)


class Sinusoidal(Scheme):
    """``x_l = E[w_l] + p_l`` with the notes' fixed sinusoids, which extend to any length.

    With ``model.scale_embeddings`` the token embedding is ``sqrt(d) E[w_l]`` instead (Vaswani et
    al. 2017), so that a token's identity (entries of about 0.02 at initialisation) does not
    drown in its position (entries of about 1).
    """

    name = "sinusoidal"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        self.d = config.d_model
        self.scale = math.sqrt(self.d) if config.scale_embeddings else 1.0
        self.register_buffer("table", sinusoidal_table(config.position_range, self.d), False)

    def embed(self, x: torch.Tensor, where: Positions) -> torch.Tensor:
        table = self.table
        if where.limit > table.shape[0]:  # past the trained context: computed
            table = sinusoidal_table(where.limit, self.d, device=table.device)
        p = table[where.queries].to(x.dtype)  # (T, d) or (B, T, d)
        return x * self.scale + p if self.scale != 1.0 else x + p


class Learned(nn.Embedding, Scheme):
    """``x_l = E[w_l] + P[l]`` with a learned table ``P`` of one row per trained position (GPT-2),
    which has nothing to say past the last one. An ``nn.Embedding``, initialised as one."""

    name = "learned"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        nn.Embedding.__init__(self, config.position_range, config.d_model)

    def embed(self, x: torch.Tensor, where: Positions) -> torch.Tensor:
        if where.limit > self.num_embeddings:  # known without a device read
            raise PositionOutOfRange(
                f"learned positions cover 0..{self.num_embeddings - 1}; position "
                f"{where.limit - 1} has no trained vector (use a shorter context)"
            )
        return x + F.embedding(where.queries, self.weight)
