"""Position schemes, as in the notes' "Position tells the model where a matching token
occurred".

The notes give two ways a position enters a transformer, "add position features, or rotate
query/key features using their positions"; ALiBi adds a third, a bias on the scores. Each scheme
is one class that says where it acts (its row's ``place``): on the embeddings, on the queries and
keys, on the scores, or nowhere; docs/positions.md has every scheme's formula and paper, and each
class's docstring its equation.

A scheme overrides only the hooks of its place (:class:`~lm.model.schemes.base.Scheme`), and
the model and attention call the hooks of that place without asking which scheme they hold. A new
scheme is its class and its row in ``lm.config.names.SCHEMES``, which names the class
(``module:Class``); :data:`SCHEME_CLASSES` is read from the rows. Each attention layer builds its
own scheme (``cls(config, layer)``), so a scheme knows its layer; a scheme of the embeddings is
built once, by the model.

The schemes live by family: ``embeddings`` (sinusoids, a learned table), ``rope`` (RoPE, with
partial rotation, p-RoPE and the context extensions PI, NTK-aware and YaRN, each with its formula
and source; xPos), ``biases`` (ALiBi, T5, KERPLE, FIRE, Sandwich: biases of positions, on one
base, :class:`~lm.model.schemes.base.ScoreBias`), ``content`` (FoX, CoPE: biases of the layer's
content). Every scheme counts real tokens only (:mod:`lm.model.masks`).
"""

from __future__ import annotations

import importlib

from lm.config.names import SCHEMES, Place, SchemeRow
from lm.config.outside import scheme_class
from lm.model.schemes.base import Scheme, ScoreBias


def _scheme_class(row: SchemeRow) -> type[Scheme]:
    module, name = row.code.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


class _Classes(dict):
    """Builtins by name; an outside scheme by its spec, as the config loaded it."""

    def __missing__(self, spec: str) -> type[Scheme]:
        return scheme_class(spec)


SCHEME_CLASSES: dict[str, type[Scheme]] = _Classes(
    {name: _scheme_class(row) for name, row in SCHEMES.items()}
)
"""Every ``model.position``'s class, by name, in the table's order (iterating it gives the
builtins); a spec of a scheme outside lm finds its class too (``lm.config.outside``)."""


def reads_content(name: str) -> bool:
    """A score bias that reads the layer's content (FoX's, CoPE's), not positions alone."""
    cls = SCHEME_CLASSES[name]
    return cls.place is Place.SCORES and not issubclass(cls, ScoreBias)


CONTENT_BIASES = tuple(name for name in SCHEMES if reads_content(name))
"""The builtin score biases that read the layer's content (FoX's, CoPE's)."""
