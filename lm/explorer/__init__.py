"""``lm view``: one self-contained HTML page of a run's attention and position signal, or of a
comparison's runs side by side; a local server that recomputes it for typed text."""
