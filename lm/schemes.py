"""Every builtin position scheme's class, from one public module, to read or to subclass: a
scheme written outside lm (docs/positions.md, "Your own scheme") is a subclass of :class:`Scheme`
(or :class:`ScoreBias`) that declares its :class:`SchemeRow`, or a subclass of one of these,
which inherits its row. The classes live by family under ``lm.model.schemes``."""

from lm.config.names import Place, SchemeRow
from lm.model.cache import KVCache
from lm.model.masks import Mask, Positions
from lm.model.schemes.base import NoPosition, Scheme, ScoreBias
from lm.model.schemes.biases import FIRE, KERPLE, T5, ALiBi, Sandwich
from lm.model.schemes.content import CoPE, FoX
from lm.model.schemes.dape import DAPE
from lm.model.schemes.embeddings import Learned, Sinusoidal
from lm.model.schemes.fope import FoPE
from lm.model.schemes.hope import HoPE
from lm.model.schemes.path import PaTH
from lm.model.schemes.pope import PoPE
from lm.model.schemes.rope import RoPE, XPos

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
