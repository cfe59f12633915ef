"""ALiBi with a learned slope per head, a position scheme written outside lm.

ALiBi (Press, Smith and Lewis 2022, "Train Short, Test Long: Attention with Linear Biases
Enables Input Length Extrapolation", arXiv 2108.12409) adds ``-m_h |l - j|`` to the score of
query position l and key position j, with one fixed slope ``m_h`` per head: the geometric
sequence 2^(-8/H), 2^(-16/H), ... The paper fixes the slopes (its section 3: trainable ones did not
extrapolate as well). Here every layer learns its own, starting at ALiBi's,
so step 0 is ALiBi exactly and training may move them.

    lm train configs/default.yaml \\
        --set model.position=examples/alibi_learned_slopes.py:LearnedSlopes

(docs/positions.md, "Your own scheme".)
"""

import torch
from torch import nn

import lm


class LearnedSlopes(lm.schemes.ALiBi):
    """ALiBi's bias ``-m_h |l - j|`` with ``m_h`` a parameter of each layer."""

    # Its bias now has learned parameters (their gradient goes through the kernel), and each
    # layer has its own, so the layers no longer share one bias.
    row = lm.SchemeRow(place=lm.Place.SCORES, learned_bias=True)
    one_bias = False

    def __init__(self, config, layer=None):
        super().__init__(config, layer)  # ALiBi's slopes, self.slopes [H]
        self.learned = nn.Parameter(self.slopes.clone())  # m_h, from ALiBi's

    def arguments(self, where: lm.Positions) -> tuple[torch.Tensor]:
        # ALiBi's formula, -slopes[head] * |query - key|, reads these slopes instead.
        return (self.learned,)
