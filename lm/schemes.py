"""Every builtin position scheme's class, from one public module, to read or to subclass: a
scheme written outside lm (docs/positions.md, "Your own scheme") is a subclass of :class:`Scheme`
(or :class:`ScoreBias`) that declares its :class:`SchemeRow`, or a subclass of one of these,
which inherits its row. The classes live by family under ``lm.model.position``."""

from lm.config.names import Place, SchemeRow
from lm.model.cache import KVCache
from lm.model.masks import Mask, Positions
from lm.model.position.base import NoPosition, Scheme, ScoreBias
from lm.model.position.biases import FIRE, KERPLE, T5, ALiBi, Sandwich
from lm.model.position.content import CoPE, FoX
from lm.model.position.dape import DAPE
from lm.model.position.embeddings import Learned, Sinusoidal
from lm.model.position.fope import FoPE
from lm.model.position.hope import HoPE
from lm.model.position.path import PaTH
from lm.model.position.pope import PoPE
from lm.model.position.rope import RoPE, XPos

__all__ = [
    "DAPE",
    "FIRE",
    "KERPLE",
    "T5",
    "ALiBi",
    "CoPE",
    "FoPE",
    "FoX",
    "HoPE",
    "KVCache",
    "Learned",
    "Mask",
    "NoPosition",
    "PaTH",
    "Place",
    "PoPE",
    "Positions",
    "RoPE",
    "Sandwich",
    "Scheme",
    "SchemeRow",
    "ScoreBias",
    "Sinusoidal",
    "XPos",
]
