"""Hugging Face ``transformers``, both ways: ``weights`` (lm's weights in GPT-NeoX, GPT-2 and MPT
layouts), ``rope`` (RoPE's settings as ``rope_parameters``), ``export`` (``lm export``) and
``importer`` (``lm import``)."""
