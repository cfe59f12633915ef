"""Multi-head attention as the notes write it ("Attention and Position": self-attention, the
causal mask, multiple heads):

    Q = X W_Q^T,  K = X W_K^T,  V = X W_V^T,   S = Q K^T / sqrt(d_k),
    Y_h = softmax_row(S + B + M) V  per head,  Y = Concat(Y_1, ..., Y_b) W_O^T

Rows are queries, columns are keys. A layer reads where its tokens sit and its window's mask
``M``, both made once per forward pass (:mod:`lm.model.masks`); its position scheme
(:mod:`lm.model.schemes`) may rotate queries and keys or give a score bias ``B``, and SSMax
scales the queries (:mod:`lm.model.normalize`); this module never asks which scheme it holds,
only where it acts. :func:`attend` adds ``B`` and ``M`` to the scores in the pass's kernel: the
notes' formula written out (:func:`lm.model.kernels.attention`), SDPA, FlexAttention, or
stick-breaking in place of the softmax.

Two settings of the Llama-style block act here. Grouped-query attention (Ainslie et al. 2023,
``model.n_kv_head``): ``n_kv_head`` key and value heads, each read by the ``n_head / n_kv_head``
query heads of its group; the cache and the kernels take them as they are, SDPA and
FlexAttention with their own grouped-query option, the formulas written out with each group's
heads repeated (:func:`lm.model.kernels.per_query_head`). QK-norm (``model.qk_norm``; Henry et
al. 2020, Qwen3): RMSNorm over each head's query and key, with a trained gain per feature,
before the position scheme rotates them or biases their scores.

Smeared keys (``model.smear_keys``; Olsson et al. 2022, the smeared-key architecture): each key
mixed with its document's previous token's by a trained gate per key head, after QK-norm and
before the scheme's rotation (:class:`SmearKeys`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lm.config.names import Place
from lm.config.sections import ModelConfig
from lm.model.kernels import attention, flex, per_query_head, scores, stick_breaking
from lm.model.masks import Mask, Positions
from lm.model.normalize import SSMax
from lm.model.rmsnorm import RMSNorm
from lm.model.schemes import SCHEME_CLASSES
from lm.model.schemes.base import NoPosition


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
        self.n_head, self.head_dim, self.kv_heads = config.n_head, config.head_dim, config.kv_heads
        self.layer, self.window = layer, config.layer_windows[layer]  # window None: every key
        self.dropout = config.dropout
        width = (self.n_head + 2 * self.kv_heads) * self.head_dim
        self.qkv = nn.Linear(config.d_model, width, bias=config.bias)
        self.qk_norm = config.qk_norm
        if config.qk_norm:  # a gain per feature of a head, shared by the heads
            self.q_norm = RMSNorm(config.head_dim, eps=config.norm_eps)
            self.k_norm = RMSNorm(config.head_dim, eps=config.norm_eps)
        self.out = nn.Linear(config.d_model, config.d_model, bias=config.bias)  # W_O
        scheme = SCHEME_CLASSES[config.layer_positions[layer]]  # its row's class
        acts = scheme.place in (Place.QUERIES_AND_KEYS, Place.SCORES)  # here, not on E[w]
        self.position = scheme(config, layer) if acts else NoPosition()
        self.rotates = scheme.place is Place.QUERIES_AND_KEYS  # its hook: rotate
        self.biases = scheme.place is Place.SCORES  # its hook: score_bias
        self.ssmax = SSMax(config) if config.normalize == "ssmax" else None  # None: softmax alone
        self.smear = SmearKeys(config, layer) if config.smear_keys else None

    def forward(self, x: torch.Tensor, where: Positions, mask: Mask, cache=None, weights=False):
        """Self-attention of ``x [B, T, d]``, its tokens at ``where``, reading the keys ``mask``
        allows: ``[B, T, d]``. With ``cache``, the new keys and values join those of the earlier
        tokens; with ``weights``, also ``(S + B + M, A)`` (:func:`attend`)."""
        q, k, v = self.project(x)  # (B, H, T, d_k), k and v (B, H_kv, T, d_k)
        q, k = (self.q_norm(q), self.k_norm(k)) if self.qk_norm else (q, k)  # QK-norm: first
        k = k if self.smear is None else self.smear(k, where.previous, cache)  # before rotating
        if self.rotates:
            q, k = self.position.rotate(q, k, where)
        if cache is not None:  # every slot's keys and values, (B, H_kv, capacity, d_k)
            k, v = cache.store(self.layer, k, v)
        B = self.position.score_bias(where, mask, x, q, k, cache) if self.biases else None
        if self.ssmax is not None:
            q = self.ssmax.scale(q, mask)  # SSMax's s_h log n
        y = attend(q, k, v, mask, B, self.dropout if self.training else 0.0, weights)
        y, kept = y if weights else (y, None)  # (B, H, T, d_k)
        y = self.out(y.transpose(1, 2).flatten(2))  # heads concatenated, then W_O
        return (y, kept) if weights else y

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``Q, K, V = X W_Q^T, X W_K^T, X W_V^T`` in one matmul: ``[B, H|H_kv|H_kv, T, d_k]``."""
        qkv = self.qkv(x).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # (B, H+2H_kv, T, d_k)
        return qkv.split([self.n_head, self.kv_heads, self.kv_heads], dim=1)


class SmearKeys(nn.Module):
    """Smeared keys (Olsson et al. 2022, "In-context Learning and Induction Heads", the smeared
    key architecture): key head h mixes each key with its previous token's by a trained gate,
    ``k'_t = sigmoid(a_h) k_t + (1 - sigmoid(a_h)) k_(t-1)``, so that one layer can match a
    query against the token before a key (an induction head without a previous-token head).
    ``a_h`` starts at 0: an even mix, where the gate's slope is steepest. The previous token is
    the previous real token of the key's document; a document's first token has no such token
    and keeps its own key (``Positions.previous``)."""

    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        self.layer = layer
        self.gate = nn.Parameter(torch.zeros(config.kv_heads))  # a_h, one per key head

    def forward(self, k: torch.Tensor, previous: torch.Tensor, cache=None) -> torch.Tensor:
        """``k [B, H_kv, T, d_k]`` smeared; ``previous [B|1, T]`` indexes this pass's keys, -1
        the last one ``cache`` kept of an earlier pass."""
        keys = k if cache is None else cache.with_last_key(self.layer, k)  # (B, H_kv, 1+T, d_k)
        index = previous if cache is None else previous + 1
        before = keys.gather(2, index.view(-1, 1, k.shape[2], 1).expand_as(k))
        g = torch.sigmoid(self.gate).to(k.dtype).view(-1, 1, 1)  # (H_kv, 1, 1)
        return torch.lerp(before, k, g)  # before + g (k - before): k itself where before is k


def attend(q, k, v, mask: Mask, B=None, dropout: float = 0.0, weights: bool = False):
    """``Y = softmax_row(S + B + M) V`` ``[B, H, Lq, d_v]`` in the mask's kernel, for q ``[B, H,
    Lq, d_k]``, k and v ``[B, H_kv, Lk, d]`` (a group of query heads each), ``M`` the mask's and
    ``B`` a scheme's score bias (float ``[B|1, H, Lq, Lk]``, or FlexAttention's score function);
    dropout acts on ``A``. ``weights`` (the formula written out): ``(Y, (S + B + M, A))``."""
    M, gqa = mask.allowed, k.shape[1] != q.shape[1]  # gqa: grouped query heads
    B = B.to(q.dtype) if isinstance(B, torch.Tensor) else B  # in the scores' dtype
    if mask.kernel == "flex":
        y = flex(q, k, v, score_mod=B, block_mask=M, enable_gqa=gqa)
    elif mask.kernel in ("math", "stick_breaking"):  # the notes' formula, written out
        k, v = per_query_head(k, q.shape[1]), per_query_head(v, q.shape[1])
        formula = attention if mask.kernel == "math" else stick_breaking
        y, A = formula(q, k, v, M, B, dropout)
    else:  # SDPA takes M + B as one float mask, -inf where M blocks
        M = M if B is None else B if M is None else B.masked_fill(~M, float("-inf"))
        y = F.scaled_dot_product_attention(q, k, v, M, dropout, mask.causal, enable_gqa=gqa)
    if mask.no_keys is not None:  # a query with no key to read (left padding) read every key
        y = y.masked_fill(mask.no_keys, 0.0)  # instead: its output is zero
    return (y, shown(scores(q, k, M, B), A, mask.no_keys)) if weights else y


def shown(S: torch.Tensor, A: torch.Tensor, no_keys: torch.Tensor | None) -> tuple:
    """``(S + B + M, A)`` as the attention pictures show them: no weight for a query that has no
    key to read."""
    if no_keys is None:
        return S, A
    return S.masked_fill(no_keys, float("-inf")), A.masked_fill(no_keys, 0.0)
