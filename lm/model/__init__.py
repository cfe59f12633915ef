"""The network, beside the notes: ``transformer`` (embeddings, blocks, head, the loss),
``attention`` (multi-head attention), ``kernels`` (``softmax(S + M) V`` three ways), ``masks``
(which keys each query reads, where each token sits), ``plan`` (what the layers of one forward
pass share), ``cache`` (the KV cache) and ``position`` (the position schemes, one class each)."""

from lm.model.transformer import TransformerLM

__all__ = ["TransformerLM"]
