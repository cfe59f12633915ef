"""Position schemes as parts, as in the notes' "Position tells the model where a matching token
occurred".

The notes give two ways a position enters a transformer, "add position features, or rotate
query/key features using their positions"; ALiBi adds a third, a bias on the scores. Each scheme
is one small part that says where it acts:

==================  ==========================  ==============================================
acts on             scheme                      what it does
==================  ==========================  ==============================================
embeddings          ``sinusoidal``, ``learned``  ``x_l = E[w_l] + p_l``
queries and keys    ``rope``                    pair i of q_l and k_l rotated by ``l theta_i``
scores              ``alibi``                   ``S_lj - m_h |l - j|``
scores              ``t5``                      ``S_lj + b_h[bucket(l - j)]``, b learned
scores              ``kerple``                  ``S_lj - r1_h log(1 + r2_h |l - j|)``, r learned
scores              ``fire``                    ``S_lj + f_h(psi(l - j) / psi(max(L, l)))``
nothing             ``none``                    only the causal mask orders the tokens
==================  ==========================  ==============================================

ALiBi, T5's and KERPLE's biases are functions of the distance ``l - j``; FIRE's (a learned MLP
``f``) also of the query position, which it divides the distance by. Each names its paper and
says whether its parameters are shared across layers.

A part overrides only the hooks of its place (:class:`~lm.model.position.base.Scheme`), and the
model and attention call every hook without asking which scheme they hold. A new scheme is a new
part in :data:`SCHEMES` and a row of ``lm.config.names.SCHEME_PLACES``. Each attention layer
builds its own part (``attention_part(config, layer)``), so a part knows its layer.

The parts live by family: ``embeddings`` (sinusoids, a learned table), ``rope`` (RoPE, with
partial rotation and the context extensions PI, NTK-aware and YaRN, each with its formula and
source), ``biases`` (ALiBi, T5, KERPLE, FIRE). Every scheme counts real tokens only
(:mod:`lm.model.masks`).
"""

from __future__ import annotations

from lm.config.sections import ModelConfig
from lm.model.position.base import NoPosition, Scheme
from lm.model.position.biases import FIRE, KERPLE, T5, ALiBi
from lm.model.position.embeddings import Learned, Sinusoidal
from lm.model.position.rope import RoPE

SCHEMES: dict[str, type[Scheme]] = {
    part.name: part for part in (RoPE, Sinusoidal, Learned, ALiBi, T5, KERPLE, FIRE, NoPosition)
}
"""Every ``model.position``, by name, in the order of ``lm.config.names.SCHEME_PLACES``."""


def embedding_part(config: ModelConfig) -> Scheme:
    """What the model adds to the token embeddings: the scheme's part if it acts there (a scheme
    that does is never chosen per layer, so layer 0's scheme is every layer's)."""
    part = SCHEMES[config.layer_positions[0]]
    return part(config) if part.acts_on == "embeddings" else NoPosition(config)


def attention_part(config: ModelConfig, layer: int = 0) -> Scheme:
    """What attention layer ``layer`` does with positions: its scheme's part if it acts there."""
    part = SCHEMES[config.layer_positions[layer]]
    if part.acts_on in ("queries and keys", "scores"):
        return part(config, layer)
    return NoPosition(config, layer)
