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

Two settings of the Llama-style block act here. Grouped-query attention (Ainslie et al. 2023,
``model.n_kv_head``): ``n_kv_head`` key and value heads, each read by the ``n_head / n_kv_head``
query heads of its group; the cache and the kernels take them as they are, SDPA and
FlexAttention with their own grouped-query option, the formulas written out with each group's
heads repeated (:func:`lm.model.kernels.per_query_head`). QK-norm (``model.qk_norm``; Henry et
al. 2020, Qwen3): RMSNorm over each head's query and key, with a trained gain per feature,
before the position scheme rotates them or biases their scores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lm.config.names import Place
from lm.config.sections import ModelConfig
from lm.model.cache import KVCache
from lm.model.kernels import attention, flex, per_query_head, scores, stick_breaking
from lm.model.normalize import query_scale
from lm.model.plan import AdditiveMask, Plan
from lm.model.position import attention_scheme
from lm.model.rmsnorm import RMSNorm


class MultiHeadAttention(nn.Module):
    """``Y = Concat(Y_1, ..., Y_b) W_O^T``, per-head ``W_Q, W_K, W_V`` (notes, "Multiple heads").

    The per-head projections are stored stacked in one ``[(H + 2 H_kv) d_k, d]`` matrix (``[3
    d, d]`` with a key/value head per query head): rows ``h d_k ... (h+1) d_k`` are query head
    h's ``W_Q``, then come the ``H_kv`` key heads' ``W_K`` and the value heads' ``W_V``. That is
    the same math as separate matrices, done as one matmul. ``layer`` is this layer's index in
    the model (its slot in a KV cache).
    """

    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        if config.d_model % config.n_head:
            raise ValueError(f"d_model={config.d_model} is not divisible by n_head={config.n_head}")
        self.n_head, self.head_dim, self.layer = config.n_head, config.head_dim, layer
        self.kv_heads = config.kv_heads
        self.dropout = config.dropout
        self.window = config.layer_windows[layer]  # None: every key
        width = (config.n_head + 2 * config.kv_heads) * config.head_dim
        self.qkv = nn.Linear(config.d_model, width, bias=config.bias)
        self.qk_norm = config.qk_norm
        if config.qk_norm:  # a gain per feature of a head, shared by the heads
            self.q_norm = RMSNorm(config.head_dim, eps=config.norm_eps)
            self.k_norm = RMSNorm(config.head_dim, eps=config.norm_eps)
        self.out = nn.Linear(config.d_model, config.d_model, bias=config.bias)  # W_O
        self.position = attention_scheme(config, layer)
        self.rotates = self.position.place is Place.QUERIES_AND_KEYS  # its hook: rotate
        self.biases = self.position.place is Place.SCORES  # its hook: score_bias
        self.normalization = query_scale(config)  # SSMax's; None: the kernel's softmax alone

    def forward(self, x: torch.Tensor, plan: Plan, cache: KVCache | None = None) -> torch.Tensor:
        """Self-attention of ``x [B, T, d]`` as ``plan`` places and masks it, ``[B, T, d]``.
        With ``cache``, the new keys and values join those of the earlier tokens."""
        plan = plan.at_window(self.window)  # the keys this layer may read
        q, k, v = self.project(x)  # (B, H, T, d_k), k and v (B, H_kv, T, d_k)
        q, k = (self.q_norm(q), self.k_norm(k)) if self.qk_norm else (q, k)  # QK-norm: first
        if self.rotates:
            q, k = self.position.rotate(q, k, plan)
        if cache is not None:  # every slot's keys and values, (B, H_kv, capacity, d_k)
            k, v = cache.store(self.layer, k, v)
        bias = self.position.score_bias(plan, x, q, k, cache) if self.biases else None  # M + B
        if self.normalization is not None:
            q = self.normalization.scale(q, plan)  # SSMax's s_h log n
        y = attend(q, k, v, plan, bias, self.dropout if self.training else 0.0)  # (B, H, T, d_k)
        return self.out(y.transpose(1, 2).flatten(2))  # heads concatenated, then W_O

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``Q, K, V = X W_Q^T, X W_K^T, X W_V^T`` in one matmul: ``[B, H|H_kv|H_kv, T, d_k]``."""
        qkv = self.qkv(x).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # (B, H+2H_kv, T, d_k)
        return qkv.split([self.n_head, self.kv_heads, self.kv_heads], dim=1)


def attend(q, k, v, plan: Plan, bias: AdditiveMask | None = None, dropout: float = 0.0):
    """``Y = softmax(S + M) V`` ``[B, H, Lq, d_v]`` by the plan's kernel, for q ``[B, H, Lq, d_k]``
    and k, v ``[B, H_kv, Lk, d]`` (a group of query heads each). ``bias``: a layer's ``M + B`` as
    the plan made it (a float tensor, or FlexAttention's score function); dropout acts on ``A``."""
    mask, gqa = plan.mask if bias is None else bias, k.shape[1] != q.shape[1]  # grouped
    if plan.kernel == "flex":
        y = flex(q, k, v, score_mod=bias, block_mask=plan.mask, enable_gqa=gqa)
    elif plan.kernel in ("math", "stick_breaking"):  # the notes' formula, written out
        k, v = per_query_head(k, q.shape[1]), per_query_head(v, q.shape[1])
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
        y = F.scaled_dot_product_attention(q, k, v, mask, dropout, plan.is_causal, enable_gqa=gqa)
    # A query with no key to read (left padding) read every key instead; its output is zero.
    return y if plan.no_keys is None else y.masked_fill(plan.no_keys, 0.0)
