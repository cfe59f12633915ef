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
from lm.model.masks import Mask, Positions


class PositionOutOfRange(LMError):
    """A learned position table has no row for this position."""


class Scheme(nn.Module):
    """A position scheme, built as ``cls(config, layer)`` (``layer``: the attention layer it
    serves; None: the embeddings). Its row (``row``: a builtin's line of
    :data:`lm.config.names.SCHEMES`, found by ``name``; a scheme written outside lm declares its
    own, or inherits its builtin base's) says where it acts, ``place``; the model and attention
    call the hooks of that place and no other:

    - ``embed`` (the model, once, on ``E[w]``): sinusoids, a learned table;
    - ``rotate`` (each attention layer, on queries and keys): RoPE, xPos;
    - ``score_bias`` (each attention layer, on the scores): a bias ``B`` of positions (ALiBi,
      T5, KERPLE, FIRE, Sandwich: :class:`ScoreBias`) or of the layer's content too (FoX's gates
      of its input, CoPE's of its queries and keys), which the kernel adds to the scores with
      the mask ``M``.
    """

    name = ""
    row: SchemeRow
    place: Place
    one_bias = False
    """True: every layer of this scheme reads one bias ``B``, made once per forward pass by the
    model from its first such layer (:meth:`ScoreBias.bias`)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        builtin = cls.__module__.startswith("lm.model.schemes")
        if builtin and "name" in cls.__dict__:  # a scheme, not a base of some (ScoreBias)
            cls.row = SCHEMES[cls.name]
        if "row" in cls.__dict__:  # an outside scheme's own row (lm.config.outside checks it)
            cls.place = cls.row.place

    def embed(self, x: torch.Tensor, where: Positions) -> torch.Tensor:
        """``x [B, T, d]`` (the token embeddings) with the position added."""
        raise NotImplementedError

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, where: Positions
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys ``[B, H, T, d_k]`` as attention scores them."""
        raise NotImplementedError

    def score_bias(
        self,
        where: Positions,
        mask: Mask,
        x: torch.Tensor | None = None,
        q: torch.Tensor | None = None,
        k: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor | Callable:
        """This scheme's score bias ``B``: a float tensor ``[B|1, H, Lq, Lk]`` that the kernel adds
        to the scores with the mask ``M``, or, where ``mask``'s kernel is flex, FlexAttention's
        ``score_mod(score, b, h, q, k)`` that adds it. ``x [B, T, d]`` is the layer's input and
        ``q``, ``k`` its queries and keys (``[B, H, T | slots, d_k]``, every slot's keys with a
        ``cache``), for a bias of content."""
        raise NotImplementedError


class NoPosition(Scheme):
    """``none``: no position signal; only the causal mask breaks the permutation symmetry (notes,
    "Self-attention without positions is permutation equivariant")."""

    name = "none"

    def __init__(self, config=None, layer: int | None = None):
        super().__init__()


class ScoreBias(Scheme):
    """A bias of positions on the scores, ``A = softmax(S + B + M)``, written as its paper writes
    it: ``formula(*arguments, head, query_position, key_position)``, a plain function of the
    distances and the layer's parameters (``arguments()``, computed once per forward pass). It
    runs on tensors that broadcast (``[1, H, 1, 1]``, ``[B|1, 1, Lq, 1]``, ``[B|1, 1, 1, Lk]``)
    or, inside FlexAttention's score function, on one pair's 0-d tensors. With ``one_bias`` set,
    the model makes the bias once per forward pass from the first layer of the scheme and every
    layer reads it (``Positions.biases``); otherwise each layer makes its own."""

    formula: Callable[..., torch.Tensor]

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        self.heads = config.n_head

    def arguments(self, where: Positions) -> tuple:
        """What :attr:`formula` takes before ``(head, query, key)``: the layer's parameters."""
        return ()

    def score_bias(self, where: Positions, mask: Mask, *content: object) -> torch.Tensor | Callable:
        # a bias of positions alone: the layer's content (x, q, k, cache) is not read
        return where.biases[type(self)] if self.one_bias else self.bias(where, mask)

    def bias(self, where: Positions, mask: Mask) -> torch.Tensor | Callable:
        """``B`` at ``where`` in the form of ``mask``'s kernel: FlexAttention's score function,
        or a float tensor ``[B|1, H, Lq, Lk]`` computed in fp32 (whatever window ``mask``'s)."""
        bias = functools.partial(self.formula, *self.arguments(where))
        Lq, Lk = where.queries.shape[-1], where.keys.shape[-1]
        if mask.kernel == "flex":
            pos = where.queries.view(-1, Lq).expand(where.batch, -1)  # (B, Lq)
            key_pos = where.keys.view(-1, Lk).expand(where.batch, -1)  # (B, Lk)

            def score_mod(s, b, h, q, k):
                return s + bias(h, pos[b, q], key_pos[b, k])

            return score_mod
        head = torch.arange(self.heads, device=where.queries.device).view(1, -1, 1, 1)
        q = where.queries.view(-1, 1, Lq, 1)  # (B|1, 1, Lq, 1)
        k = where.keys.view(-1, 1, 1, Lk)
        return bias(head, q, k)  # (B|1, H, Lq, Lk)
