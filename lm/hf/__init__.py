"""Hugging Face ``transformers``, both ways: ``weights`` (lm's weights in each layout of
:data:`MODELS`), ``rope`` (RoPE's settings as ``rope_parameters``), ``export`` (``lm export``)
and ``importer`` (``lm import``)."""

MODELS = {
    "gpt2": ("GPT-2", "GPT2LMHeadModel"),
    "gpt_neox": ("GPT-NeoX", "GPTNeoXForCausalLM"),
    "mpt": ("MPT", "MptForCausalLM"),
    "llama": ("Llama", "LlamaForCausalLM"),
    "qwen3": ("Qwen3", "Qwen3ForCausalLM"),
}
"""The transformers model types lm exports to and imports from: each one's name as people
know it, and its architecture class. Here, importing nothing, so that ``lm import --help``
names them from this table without loading torch."""
