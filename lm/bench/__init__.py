"""lm bench: one position scheme through a fixed battery, its card against the builtins'
references (docs/bench.md)."""
