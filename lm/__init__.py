"""lm: a small, fast, honest trainer for next-token language models.

The model follows the lecture notes "Attention and Position": ``lm.model`` (the decoder-only LM),
``lm.attention`` (multi-head attention), ``lm.kernels`` (the notes' formula and causal mask),
``lm.position`` (the position schemes: RoPE, sinusoids, learned, ALiBi, T5, KERPLE, FIRE, none).
``lm.train.train(config, run_dir)`` is the training loop; ``lm.cli`` the command line.
"""

__version__ = "0.1.0"
