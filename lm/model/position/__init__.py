"""Position schemes as parts, as in the notes' "Position tells the model where a matching token
occurred".

The notes give two ways a position enters a transformer, "add position features, or rotate
query/key features using their positions"; ALiBi adds a third, a bias on the scores. Each scheme
is one small part that says where it acts:

==================  ===========================  ===============================================
acts on             scheme                       what it does
==================  ===========================  ===============================================
embeddings          ``sinusoidal``, ``learned``  ``x_l = E[w_l] + p_l``
queries and keys    ``rope``                     pair i of q_l and k_l rotated by ``l theta_i``
queries and keys    ``xpos``                     RoPE, q and k scaled so scores decay ``zeta^(l-j)``
scores              ``alibi``                    ``S_lj - m_h |l - j|``
scores              ``t5``                       ``S_lj + b_h[bucket(l - j)]``, b learned
scores              ``kerple``                   ``S_lj - r1_h log(1 + r2_h |l - j|)``, r learned
scores              ``fire``                     ``S_lj + f_h(psi(l - j) / psi(max(L, l)))``
scores              ``sandwich``                 ``S_lj + c_h (p_l . p_j - d/2)``, sinusoids p
scores              ``fox``                      ``S_lj + sum_{t=j+1..l} log f_t``, gates of x_t
scores              ``cope``                     ``S_lj + q_l . e[sum_{t=j..l} sigma(q_l . k_t)]``
nothing             ``none``                     only the causal mask orders the tokens
==================  ===========================  ===============================================

ALiBi's, T5's, KERPLE's and Sandwich's biases are functions of the distance ``l - j``; FIRE's (a
learned MLP ``f``) also of the query position, which it divides the distance by; FoX's and CoPE's
of the layer's content. Each names its paper and says whether its parameters are shared across
layers.

A part overrides only the hooks of its place (:class:`~lm.model.position.base.Scheme`), and the
model and attention call every hook without asking which scheme they hold. A new scheme is a new
part in :data:`SCHEMES` and a row of ``lm.config.names.SCHEME_PLACES``. Each attention layer
builds its own part (``attention_part(config, layer)``), so a part knows its layer.

The parts live by family: ``embeddings`` (sinusoids, a learned table), ``rope`` (RoPE, with
partial rotation, p-RoPE and the context extensions PI, NTK-aware and YaRN, each with its formula
and source; xPos), ``biases`` (ALiBi, T5, KERPLE, FIRE, Sandwich: biases of positions),
``content`` (FoX, CoPE: biases of the layer's content). Every scheme counts real tokens only
(:mod:`lm.model.masks`).
"""

from __future__ import annotations

from lm.config.sections import ModelConfig
from lm.model.position.base import NoPosition, Scheme
from lm.model.position.biases import FIRE, KERPLE, T5, ALiBi, Sandwich
from lm.model.position.content import CoPE, FoX
from lm.model.position.embeddings import Learned, Sinusoidal
from lm.model.position.rope import RoPE, XPos

PARTS = (RoPE, Sinusoidal, Learned, ALiBi, T5, KERPLE, FIRE, Sandwich, XPos, FoX, CoPE, NoPosition)
SCHEMES: dict[str, type[Scheme]] = {part.name: part for part in PARTS}
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
