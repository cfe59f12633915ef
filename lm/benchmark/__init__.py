"""lm bench: one position scheme through a fixed battery, its card against the builtins'
references (docs/bench.md). The wing is ``lm.benchmark``, as ``lm view``'s is ``lm.explorer``:
``lm.bench`` is the Python API's function."""
