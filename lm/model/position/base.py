"""What every position scheme is: a module with one hook per place a position can enter (notes,
"Position tells the model where a matching token occurred"), of which the model and attention
call only the hooks of the scheme's place; and what the score biases share (:class:`ScoreBias`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from lm.config.errors import LMError
from lm.config.names import SCHEMES, Place, SchemeRow
from lm.config.sections import ModelConfig
from lm.model.cache import KVCache
from lm.model.plan import AdditiveMask, Plan


class PositionOutOfRange(LMError):
    """A learned position table has no row for this position."""


class Scheme(nn.Module):
    """A position scheme. Its row of :data:`lm.config.names.SCHEMES` (``row``, found by
    ``name``) says where it acts, ``place``; the model and attention call the hooks of that place
    and no other:

    - ``embed`` (the model, once, on ``E[w]``): sinusoids, a learned table;
    - ``rotate`` (each attention layer, on queries and keys): RoPE, xPos;
    - ``score_bias`` (each attention layer, on the scores): a bias of positions (ALiBi, T5,
      KERPLE, FIRE, Sandwich: :class:`ScoreBias`) or of the layer's content too (FoX's gates of
      its input, CoPE's of its queries and keys);
    - ``prepare`` (the model, once per forward pass, on the first layer of each scheme whose
      ``shared`` is set): what the layers share, such as RoPE's cos and sin or ALiBi's bias.
    """

    name = ""
    row: SchemeRow
    place: Place
    shared = False
    """True: :meth:`prepare` computes, once per forward pass, what every layer of this scheme
    reads (the model calls it on the first such layer at each window)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # a scheme, not a base of some (ScoreBias)
            cls.row = SCHEMES[cls.name]
            cls.place = cls.row.place

    def __init__(self, config: ModelConfig | None = None, layer: int | None = None):
        # Every scheme is built as cls(config, layer); nn.Embedding's __init__ calls this one
        # with neither (the learned table).
        super().__init__()
        self.layer = layer  # the attention layer this scheme serves; None: the embeddings

    def embed(self, x: torch.Tensor, plan: Plan) -> torch.Tensor:
        """``x [B, T, d]`` (the token embeddings) with the position added."""
        raise NotImplementedError

    def prepare(self, plan: Plan) -> Plan:
        """The plan with what every layer of this scheme shares in one forward pass."""
        return plan

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, plan: Plan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys ``[B, H, T, d_k]`` as attention scores them."""
        raise NotImplementedError

    def score_bias(
        self,
        plan: Plan,
        x: torch.Tensor | None = None,
        q: torch.Tensor | None = None,
        k: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> AdditiveMask:
        """``M + B``: the plan's mask with this scheme's score bias ``B`` added, in the form the
        plan's kernel takes (:data:`lm.model.plan.AdditiveMask`). ``x [B, T, d]`` is the layer's
        input and ``q``, ``k`` its queries and keys (``[B, H, T | slots, d_k]``, every slot's
        keys with a ``cache``), for a bias of content."""
        raise NotImplementedError


class NoPosition(Scheme):
    """``none``: no position signal; only the causal mask breaks the permutation symmetry (notes,
    "Self-attention without positions is permutation equivariant")."""

    name = "none"


class ScoreBias(Scheme):
    """A bias of positions on the scores, ``A = softmax(S + B + M)``, written as its paper writes
    it: ``formula(*arguments, head, query_position, key_position)``, a plain function of the
    distances and the layer's parameters (``arguments(plan)``, computed once per forward pass).
    It runs on tensors that broadcast (``[1, H, 1, 1]``, ``[B|1, 1, Lq, 1]``, ``[B|1, 1, 1,
    Lk]``) or, inside FlexAttention's score function, on one pair's 0-d tensors. With ``shared``
    set, the bias is built once per forward pass by the first layer of the scheme and read by
    every other; otherwise each layer builds its own."""

    formula: Callable[..., torch.Tensor]

    def arguments(self, plan: Plan) -> tuple:
        """What :attr:`formula` takes before ``(head, query, key)``: the layer's parameters."""
        return ()

    def prepare(self, plan: Plan) -> Plan:
        return plan.sharing(type(self), self.kernel_form(plan)) if self.shared else plan

    def score_bias(self, plan: Plan, *content: object) -> AdditiveMask:
        # a bias of positions alone: the layer's content (x, q, k, cache) is not read
        return plan.shared_by(type(self)) if self.shared else self.kernel_form(plan)

    def kernel_form(self, plan: Plan) -> AdditiveMask:
        """``M + B`` as the plan's kernel takes it: FlexAttention's score function, or a float
        tensor ``[B|1, H, Lq, Lk]`` computed in fp32 and then cast, -inf where ``M`` blocks."""
        bias = functools.partial(self.formula, *self.arguments(plan))
        Lq, Lk = plan.positions.shape[-1], plan.key_positions.shape[-1]
        if plan.kernel == "flex":
            pos = plan.positions.view(-1, Lq).expand(plan.batch, -1)  # (B, Lq)
            key_pos = plan.key_positions.view(-1, Lk).expand(plan.batch, -1)  # (B, Lk)

            def score_mod(s, b, h, q, k):
                return s + bias(h, pos[b, q], key_pos[b, k])

            return score_mod
        head = torch.arange(plan.heads, device=plan.positions.device).view(1, -1, 1, 1)
        q = plan.positions.view(-1, 1, Lq, 1)  # (B|1, 1, Lq, 1)
        k = plan.key_positions.view(-1, 1, 1, Lk)
        return plan.masked(bias(head, q, k))  # (B|1, H, Lq, Lk)
