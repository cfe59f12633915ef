"""How scores become attention weights (``model.normalize``).

The notes' ``softmax_row(S + M)``; Scalable-Softmax, which scales each query's scores by the
log of how many keys it reads, so that attention does not flatten as the context grows; and
stick-breaking, which replaces the softmax (:func:`lm.model.kernels.stick_breaking`, chosen as
the pass's kernel). The softmax and stick-breaking are the kernel's; only SSMax adds a step, on
the queries, which an attention layer holding it takes (:meth:`SSMax.scale`).
"""

from __future__ import annotations

import torch
from torch import nn

from lm.config.sections import ModelConfig
from lm.model.masks import Mask


class SSMax(nn.Module):
    """Scalable-Softmax (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", arXiv
    2501.19399, eq. 2): ``A_l = softmax(s_h log(n_l) S_l + M_l)``, where ``n_l`` is the number of
    keys query l reads and ``s_h`` a learned scalar per head and layer, starting at the paper's
    0.43. The factor multiplies the query, so every kernel computes it; a position bias joins
    the scores after, unscaled."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.s = nn.Parameter(torch.full((config.n_head,), 0.43))

    def scale(self, q: torch.Tensor, mask: Mask) -> torch.Tensor:
        """Queries ``[B, H, T, d_k]`` times ``s_h log n``, n the keys ``mask`` lets each read."""
        log_n = torch.log(mask.keys_read.to(torch.float32))  # (B|1, 1, T, 1)
        return q * (self.s.view(1, -1, 1, 1) * log_n).to(q.dtype)
