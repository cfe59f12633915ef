"""lm: a small, fast, honest trainer for next-token language models.

The model follows the lecture notes "Attention and Position": ``lm.attention`` (attention,
masks), ``lm.position`` (RoPE, sinusoids, learned, ALiBi, T5, KERPLE, FIRE, none), ``lm.model``
(the decoder-only LM). ``lm.train.train(config, run_dir)`` is the training loop; ``lm.cli`` the
command line.
"""

__version__ = "0.1.0"
