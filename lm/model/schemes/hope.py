"""HoPE, High-frequency rotary Position Encoding (Chen, Lv, Luan, Wang and Liu 2025, "HoPE: A
Novel Positional Encoding Without Long-Term Decay for Enhanced Context Awareness and
Extrapolation", ACL 2025, arXiv 2410.21216, section 4).

HoPE keeps RoPE's high-frequency pairs and makes the low-frequency ones position-independent:
the pairs whose wave does not complete one period within the trained context (``theta_i L <
2 pi``) are not rotated at all. That is the computation of p-RoPE (Barbero et al. 2025, ``model
.rope_p``, :class:`lm.model.schemes.rope.RopeAngles`' ``kept``): the fastest pairs rotate at
their own frequencies and the others get frequency 0. The two papers differ only in where they
cut: p-RoPE keeps a chosen fraction ``p``, HoPE keeps the pairs that turn at least once over the
trained context ``L`` (``model.context_length``, or ``model.random_positions``). So ``hope`` is
a named setting of p-RoPE, ``p = kept / (d_k / 2)``, and a test holds it bit for bit to ``rope``
with that ``rope_p``. The paper also singles out "activated" components that it removes on
evidence from trained models; ``lm`` cuts by the period rule alone.
"""

from __future__ import annotations

import math

import torch

from lm.config.sections import ModelConfig
from lm.model.schemes.rope import RoPE, RopeAngles, rope_frequencies


def hope_kept_pairs(head_dim: int, base: float, context: int) -> int:
    """How many of a head's pairs complete a period within ``context`` positions,
    ``theta_i context >= 2 pi``: the fastest ones, which HoPE keeps rotating."""
    theta = rope_frequencies(head_dim, base)
    return int((theta * context >= 2 * math.pi).sum())


class HoPE(RoPE):
    """HoPE: RoPE with only the pairs that turn at least once over the trained context rotated
    (module docstring): p-RoPE with ``kept`` set by the context, not by ``model.rope_p``."""

    name = "hope"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config, layer)
        kept = hope_kept_pairs(config.head_dim, config.rope_base, config.position_range)
        self.rope = RopeAngles(config.head_dim, config.rope_base, kept=kept)
        cos, sin = self.rope.cos_sin(torch.arange(config.position_range))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
