"""What every position scheme's part is: four hooks, one per place a position can enter (notes,
"Position tells the model where a matching token occurred"), each doing nothing unless the
scheme acts there."""

from __future__ import annotations

import torch
from torch import nn

from lm.config.errors import LMError
from lm.config.names import SCHEME_PLACES
from lm.config.sections import ModelConfig
from lm.model.cache import KVCache
from lm.model.plan import AdditiveMask, Plan


class PositionOutOfRange(LMError):
    """A learned position table has no row for this position."""


class Scheme(nn.Module):
    """A position scheme's part. The model and attention call every hook without asking which
    scheme they hold; a part overrides the hooks of its place:

    - ``embed`` (the model, once, on ``E[w]``): sinusoids, a learned table;
    - ``prepare`` (the model, once per forward pass, by the first part of each kind): what the
      layers share, such as RoPE's cos and sin or ALiBi's bias;
    - ``rotate`` (each attention layer, on queries and keys): RoPE, xPos;
    - ``additive_mask`` (each attention layer, on the scores): a bias of positions (ALiBi, T5,
      KERPLE, FIRE, Sandwich) or of the layer's content too (FoX's gates of its input, CoPE's of
      its queries and keys).

    ``name`` is the scheme's ``model.position``; where it acts, ``acts_on``, is read from the
    config's table (:data:`lm.config.names.SCHEME_PLACES`), written there once.
    """

    name = ""
    acts_on = ""
    """embeddings | queries and keys | scores | nothing."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.acts_on = SCHEME_PLACES[cls.name]

    def __init__(self, config: ModelConfig | None = None, layer: int | None = None):
        super().__init__()

    def embed(self, x: torch.Tensor, plan: Plan) -> torch.Tensor:
        """``x [B, T, d]`` (the token embeddings) with the position added, for this scheme."""
        return x

    def prepare(self, plan: Plan) -> Plan:
        """The plan with what every layer of this scheme shares in one forward pass."""
        return plan

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, plan: Plan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys ``[B, H, T, d_k]`` as attention scores them."""
        return q, k

    def additive_mask(
        self,
        plan: Plan,
        x: torch.Tensor | None = None,
        q: torch.Tensor | None = None,
        k: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> AdditiveMask | None:
        """``M + B``: the plan's mask with this scheme's score bias ``B`` added, in the form the
        plan's kernel takes (:class:`lm.model.plan.AdditiveMask`); None: no bias, the plan's
        mask alone. ``x [B, T, d]`` is the layer's input and ``q``, ``k`` its queries and keys
        (``[B, H, T | slots, d_k]``, every slot's keys with a ``cache``), for a bias of content."""
        return None


class NoPosition(Scheme):
    """``none``: no position signal; only the causal mask breaks the permutation symmetry (notes,
    "Self-attention without positions is permutation equivariant")."""

    name = "none"
