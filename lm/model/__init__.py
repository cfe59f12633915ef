"""The network, beside the notes: ``transformer`` (embeddings, blocks, head, the loss),
``masks`` (where each token sits, read once per forward pass, and each window's mask ``M``),
``attention`` (multi-head attention), ``kernels`` (``softmax(S + B + M) V`` three ways),
``cache`` (the KV cache) and ``position`` (the position schemes, one class each)."""

from lm.model.transformer import TransformerLM

__all__ = ["TransformerLM"]
