"""RoPE with a learned frequency per pair, a position scheme written outside lm.

RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv
2104.09864, eq. 15) turns pair i of every query and key at position l by the angle
``l theta_i``, with fixed frequencies ``theta_i = base^(-2i/d)``: a score then depends on the
offset between query and key only. Here each layer learns its ``theta_i``, starting at RoPE's,
so step 0 is RoPE and training may retune the frequencies. The score still depends on the
offset only: a learned frequency is still one angle per position step.

    lm train configs/default.yaml \\
        --set model.position=examples/rope_learned_frequencies.py:LearnedFrequencies

(docs/positions.md, "Your own scheme".)
"""

import torch
from torch import nn

import lm


class LearnedFrequencies(lm.schemes.RoPE):
    """RoPE's rotation by ``l theta_i`` with ``theta_i`` a parameter of each layer."""

    # It reads rope_base (RoPE's theta_i, its start), not RoPE's context extensions.
    row = lm.SchemeRow(place=lm.Place.QUERIES_AND_KEYS, keys=("rope_base",), even=("head_dim",))

    def __init__(self, config, layer=None):
        super().__init__(config, layer)
        self.theta = nn.Parameter(self.rope.frequencies().float())  # [d_k/2], RoPE's theta_i

    def rotate(self, q, k, where: lm.Positions):
        # Angles in float64, as RoPE computes them: l * theta_i loses digits in float32.
        angles = where.queries.double()[..., None] * self.theta.double()  # ([B,] T, d_k/2)
        cos, sin = angles.cos().float(), angles.sin().float()
        if cos.dim() == 3:  # positions per sequence: the same for every head
            cos, sin = cos[:, None], sin[:, None]
        return turn(q, cos, sin), turn(k, cos, sin)


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each pair ``(x_2i, x_2i+1)`` of ``x [B, H, T, d_k]`` turned by its angle."""
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    turned = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return turned.flatten(-2).to(x.dtype)
