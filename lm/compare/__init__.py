"""Comparing runs: ``sweep`` (``lm compare``: runs over one config key, each measured), ``jobs``
(runs side by side, one process each), ``report`` (table, report.json), ``plots`` (matplotlib
pictures) and ``diagnostics`` (a trained model's attention maps, scores by offset, biases)."""
