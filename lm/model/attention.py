"""Multi-head attention as the notes write it ("Attention and Position": self-attention, the
causal mask, multiple heads):

    Q = X W_Q^T,  K = X W_K^T,  V = X W_V^T,   S = Q K^T / sqrt(d_k),
    Y_h = softmax_row(S + M) V  per head,      Y = Concat(Y_1, ..., Y_b) W_O^T

Rows are queries, columns are keys. The position scheme enters through this layer's scheme
(:mod:`lm.model.position`), which may rotate queries and keys or add a bias ``B`` to the scores
(``S + B + M``), and SSMax through its scale of the queries (:mod:`lm.model.normalize`); this
module never asks which scheme it holds, only where it acts. The mask ``M`` (with a layer's
sliding window) and the kernel are decided once per forward pass (:mod:`lm.model.plan`);
:func:`attend` runs that kernel: the notes' formula written out
(:func:`lm.model.kernels.attention`), SDPA, FlexAttention, or stick-breaking in place of the
softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lm.config.names import Place
from lm.config.sections import ModelConfig
from lm.model.cache import KVCache
from lm.model.kernels import attention, flex, scores, stick_breaking
from lm.model.normalize import query_scale
from lm.model.plan import AdditiveMask, Plan
from lm.model.position import attention_scheme


class MultiHeadAttention(nn.Module):
    """``Y = Concat(Y_1, ..., Y_b) W_O^T``, per-head ``W_Q, W_K, W_V`` (notes, "Multiple heads").

    The per-head projections are stored stacked in one ``[3 d, d]`` matrix: rows ``h d_k ...
    (h+1) d_k`` of the first third are head h's ``W_Q`` (then ``W_K``, then ``W_V``). That is the
    same math as separate matrices, done as one matmul. ``layer`` is this layer's index in the
    model (its slot in a KV cache).
    """

    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        if config.d_model % config.n_head:
            raise ValueError(f"d_model={config.d_model} is not divisible by n_head={config.n_head}")
        self.n_head, self.head_dim, self.layer = config.n_head, config.head_dim, layer
        self.dropout = config.dropout
        self.window = config.layer_windows[layer]  # None: every key
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.out = nn.Linear(config.d_model, config.d_model, bias=config.bias)  # W_O
        self.position = attention_scheme(config, layer)
        self.rotates = self.position.place is Place.QUERIES_AND_KEYS  # its hook: rotate
        self.biases = self.position.place is Place.SCORES  # its hook: score_bias
        self.normalization = query_scale(config)  # SSMax's; None: the kernel's softmax alone

    def forward(self, x: torch.Tensor, plan: Plan, cache: KVCache | None = None) -> torch.Tensor:
        """Self-attention of ``x [B, T, d]`` as ``plan`` places and masks it, ``[B, T, d]``.
        With ``cache``, the new keys and values join those of the earlier tokens."""
        plan = plan.at_window(self.window)  # the keys this layer may read
        q, k, v = self.project(x)  # (B, H, T, d_k) each
        if self.rotates:
            q, k = self.position.rotate(q, k, plan)
        if cache is not None:  # every slot's keys and values, (B, H, capacity, d_k)
            k, v = cache.store(self.layer, k, v)
        bias = self.position.score_bias(plan, x, q, k, cache) if self.biases else None  # M + B
        if self.normalization is not None:
            q = self.normalization.scale(q, plan)  # SSMax's s_h log n
        y = attend(q, k, v, plan, bias, self.dropout if self.training else 0.0)  # (B, H, T, d_k)
        return self.out(y.transpose(1, 2).flatten(2))  # heads concatenated, then W_O

    def project(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``Q = X W_Q^T``, ``K = X W_K^T``, ``V = X W_V^T``, split into heads: ``[B, H, T,
        d_k]`` each, from one matmul."""
        qkv = self.qkv(x).unflatten(-1, (3, self.n_head, self.head_dim))  # (B, T, 3, H, d_k)
        return list(qkv.permute(2, 0, 3, 1, 4).unbind(0))


def attend(q, k, v, plan: Plan, bias: AdditiveMask | None = None, dropout: float = 0.0):
    """``Y = softmax(S + M) V`` ``[B, H, Lq, d_v]`` by the plan's kernel, for q ``[B, H, Lq,
    d_k]`` and k, v ``[B, H, Lk, d]``. ``bias`` is a layer's ``M + B`` in the form the plan made
    it (a float tensor, or a score function for FlexAttention); dropout acts on ``A``."""
    mask = plan.mask if bias is None else bias
    if plan.kernel == "flex":
        y = flex(q, k, v, score_mod=bias, block_mask=plan.mask)
    elif plan.kernel in ("math", "stick_breaking"):  # the notes' formula, written out
        y, weights = (attention if plan.kernel == "math" else stick_breaking)(q, k, v, mask)
        if dropout:
            y = F.dropout(weights, dropout) @ v
        if plan.weights is not None:  # kept for the pictures; a query reading no key has none
            s = scores(q, k, mask)
            if plan.no_keys is not None:
                s = s.masked_fill(plan.no_keys, float("-inf"))
                weights = weights.masked_fill(plan.no_keys, 0.0)
            plan.weights.append((s, weights))
    else:
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=plan.is_causal
        )
    # A query with no key to read (left padding) read every key instead; its output is zero.
    return y if plan.no_keys is None else y.masked_fill(plan.no_keys, 0.0)
