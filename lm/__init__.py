"""lm: a small, fast, honest trainer for next-token language models.

The Python API (docs/python-api.md)::

    import lm
    result = lm.train("configs/default.yaml", "runs/default")
    run = lm.load("runs/default")
    print(lm.generate(run, "The with statement", max_new_tokens=100)[0])
    print(lm.loss_at(run, ["1x", "2x"]))

and the notes' formulas as the model computes them: ``lm.attention``, ``lm.causal_mask``,
``lm.attention_mask``, ``lm.sinusoids``, ``lm.rope``; ``lm.view(run, prompt)``, the
``lm view`` page inline in Jupyter; ``lm.heads(run)``, each attention head's scores;
``lm.bench(position)``, a position scheme's card against the builtins (``lm bench``);
``lm.Scheme``, ``lm.ScoreBias`` and ``lm.SchemeRow`` (with ``lm.Place``, ``lm.Positions``,
``lm.Mask``) to write a position scheme of one's own, and ``lm.schemes``, every builtin scheme's
class. The package's wings: ``lm.model`` (the network), ``lm.data``, ``lm.training``,
``lm.compare``, ``lm.benchmark``, ``lm.explorer`` (``lm view``), ``lm.hf``, on ``lm.config``,
``lm.runs`` and ``lm.runtime``. Names load on first use, so ``import lm`` (and the command
line) stays quick.
"""

import os

__version__ = "0.2.0"

# A run's numbers must not depend on its thread count (lm compare --jobs trains runs on a share
# of the cores and compares them with runs trained alone). On Intel CPUs, MKL's matrix products
# split a long sum in one part per thread unless its strict reproducible mode is on; it costs
# nothing measurable at lm's shapes (docs/performance.md). MKL reads this at its first product,
# so it is set when lm is imported; a value the user set is kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

_API = {
    "train": "lm.api",
    "load": "lm.api",
    "generate": "lm.api",
    "loss_at": "lm.api",
    "attention": "lm.api",
    "attention_mask": "lm.api",
    "causal_mask": "lm.api",
    "sinusoids": "lm.api",
    "rope": "lm.api",
    "view": "lm.api",
    "heads": "lm.api",
    "bench": "lm.api",
    "Config": "lm.config.sections",
    "LMError": "lm.config.errors",
    "load_config": "lm.config.load",
    "TransformerLM": "lm.model.transformer",
    "Scheme": "lm.schemes",
    "ScoreBias": "lm.schemes",
    "SchemeRow": "lm.schemes",
    "Place": "lm.schemes",
    "Positions": "lm.schemes",
    "Mask": "lm.schemes",
}

__all__ = ["__version__", "schemes", *_API]


def __getattr__(name: str):
    """The API's names, imported when first asked for (PEP 562); ``lm.schemes``, the builtin
    position schemes' classes."""
    if name not in _API and name != "schemes":
        raise AttributeError(f"module 'lm' has no attribute {name!r}")
    import importlib

    if name == "schemes":
        return importlib.import_module("lm.schemes")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
