"""PaTH attention (Yang, Shen, Wen, Tan, Mishra, Ren, Panda and Kim 2025, "PaTH Attention:
Position Encoding via Accumulating Householder Transformations", arXiv 2505.16381, section 3).

RoPE turns a key by a fixed angle per step of distance, the same whatever lies between. PaTH
turns it by the tokens between: every token ``t`` gives a Householder-like transform of its own
input ``x_t``,

    H_t = I - beta_t w_t w_t^T,   w_t = W_w x_t / |W_w x_t| (per head),
    beta_t = 2 sigmoid(u . x_t + b) in (0, 2),

and query i scores key j through the product of the transforms of the tokens after j up to i:

    S_ij = k_j^T (H_{j+1} H_{j+2} ... H_i) q_i / sqrt(d_k)    (S_ii = q_i . k_i / sqrt(d_k)).

A product of such transforms can express what a fixed rotation cannot (it can track a state
through the tokens), which the paper shows on flip-flop and state-tracking tasks.

The direct form (:func:`path_scores`) follows the equation: for every key j, from the last back
to the first, the vectors ``u_i = H_{j+1} ... H_i q_i`` of the queries after j take one more
transform, ``u <- u - beta_{j+1} w_{j+1} (w_{j+1} . u)``, and ``S_ij = k_j . u_i``. That is
``O(L_k L_q d_k)`` time per head per layer, the order of attention itself, in ``L_k`` steps; with
gradients on, each step's ``u`` is kept, ``O(L_k L_q d_k)`` memory per head (attention's own
scores are ``O(L_k L_q)``).

The UT form (:func:`path_scores_ut`; the paper uses it within each chunk) computes the same
scores without a step per key. For query i at slot p, write ``c_t = beta_t w_t . u_t`` for the
transforms ``t <= p`` it takes; then ``u_j = q_i - sum_{t > j} c_t w_t`` and the ``c_t`` solve one
unit upper-triangular system, the same matrix for every query:

    c_t + beta_t sum_{s > t} (w_t . w_s) c_s = beta_t w_t . q_i   (t <= p; c_t = 0 past p),
    S_ij = k_j . q_i - sum_{s > j} (k_j . w_s) c_s.

That is a few batched products and one triangular solve per head, ``O(L^2 d_k + L^3)`` time and
``O(L^2)`` memory, where the direct form takes ``L`` small steps: attention over a whole text
(training, evaluation, a prompt) takes the UT form, and decoding one new query with the KV cache,
``O(L d_k)`` direct, the direct form. A test holds the two equal. The paper's WY chunks, which
bound the solve at long contexts, are not here.

In ``lm``: the scores enter as the score bias ``B = S - q.k / sqrt(d_k)``, so every kernel that
takes a bias computes ``softmax(S + M)`` with the paper's ``S``; queries and keys are not
rotated. ``w_t`` is a linear map of ``x_t`` normalised per head; the paper's code puts a short
convolution before the normalisation, which ``lm`` leaves out. A slot that holds no real token
(padding, in a KV cache) has ``beta = 0``: its transform is the identity, so it changes nothing
between real tokens. Refused under FlexAttention (a score reads the transforms of a whole span)
and with ``ssmax`` (which scales ``q.k``, not PaTH's score).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lm.config.errors import ConfigError
from lm.config.sections import ModelConfig
from lm.model.cache import KVCache
from lm.model.kernels import per_query_head
from lm.model.masks import Mask, Positions
from lm.model.schemes.base import Scheme


def path_scores(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, start: int = 0
) -> torch.Tensor:
    """``k_j^T (H_{j+1} ... H_i) q_i`` ``[B, H, Lq, Lk]`` for queries ``q [B, H, Lq, d]`` at
    slots ``start .. start + Lq - 1`` and keys ``k``, directions ``w`` (unit) and strengths
    ``beta`` ``[B, H, Lk(, d)]`` at slots ``0 .. Lk - 1``. A key after its query, which the
    causal mask hides, gets ``q . k`` up to the last query's slot and 0 past it. The direct
    form, one key at a time (module docstring)."""
    Lq, Lk = q.shape[-2], k.shape[-2]
    last = min(start + Lq - 1, Lk - 1)  # no query reads a later slot
    u = q
    columns: list[torch.Tensor] = [q.new_zeros(q.shape[:-1])] * Lk
    for j in range(last, -1, -1):
        if j < last:  # the queries after j take H_{j+1}: u <- u - beta w (w . u)
            first = max(0, j + 1 - start)  # the first query at a slot after j
            w_next = w[..., j + 1, None, :]  # (B, H, 1, d)
            tail = u[..., first:, :]
            along = (tail * w_next).sum(-1, keepdim=True)
            tail = tail - beta[..., j + 1, None, None] * w_next * along
            u = torch.cat([u[..., :first, :], tail], dim=-2)
        columns[j] = (u * k[..., j, None, :]).sum(-1)  # (B, H, Lq)
    return torch.stack(columns, dim=-1)


def path_scores_ut(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, start: int = 0
) -> torch.Tensor:
    """:func:`path_scores` (the same arguments and result) through the UT form's one triangular
    system per head (module docstring); the keys after the last query are left out of it."""
    Lq, Lk = q.shape[-2], k.shape[-2]
    n = min(start + Lq, Lk)  # the slots some query reads
    k, w, beta = k[..., :n, :], w[..., :n, :], beta[..., :n]
    slots = torch.arange(n, device=q.device)
    later = slots[None, :] > slots[:, None]  # (t, s): s > t
    reads = slots[:, None] <= start + torch.arange(Lq, device=q.device)  # (t, i): t <= p_i
    A = (beta[..., None] * (w @ w.transpose(-2, -1))) * later  # beta_t w_t . w_s, s > t
    b = (beta[..., None] * (w @ q.transpose(-2, -1))) * reads  # beta_t w_t . q_i, t <= p_i
    c = torch.linalg.solve_triangular(A, b, upper=True, unitriangular=True)  # (B, H, n t, Lq)
    along = (k @ w.transpose(-2, -1)) * later  # k_j . w_s, s > j: (B, H, n j, n s)
    scores = q @ k.transpose(-2, -1) - (along @ c).transpose(-2, -1)  # (B, H, Lq, n)
    return F.pad(scores, (0, Lk - n))  # zero for the slots after every query, as the direct form


class PaTH(Scheme):
    """PaTH: each query scores each key through the product of the Householder-like transforms
    of the tokens between them (module docstring), given to the kernel as a score bias."""

    name = "path"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        self.layer = layer or 0  # its slot in a KV cache
        if config.normalize == "ssmax":
            raise ConfigError(
                "model.normalize: ssmax scales q.k, and PaTH's scores are not q.k; use softmax"
            )
        self.heads, self.head_dim = config.n_head, config.head_dim
        self.direction = nn.Linear(config.d_model, config.d_model, bias=False)  # W_w, per head
        self.strength = nn.Linear(config.d_model, config.n_head)  # u, b: beta = 2 sigma(.)

    def transforms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``w_t`` ``[B, H, T, d_k]`` (unit, per head) and ``beta_t`` ``[B, H, T]``, fp32."""
        w = self.direction(x).float().unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)
        beta = 2 * torch.sigmoid(self.strength(x).float()).transpose(1, 2)
        return F.normalize(w, dim=-1), beta

    def score_bias(
        self,
        where: Positions,
        mask: Mask,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        w, beta = self.transforms(x)
        start = 0
        if cache is not None:  # every slot's transforms; a slot with no real token: identity
            start = cache.start
            w = cache.keep(self.layer, "path_w", w)
            beta = cache.keep(self.layer, "path_beta", beta) * cache.key_mask[:, None]
        q32, k32 = q.float(), per_query_head(k, q.shape[1]).float()  # the group's keys
        root = math.sqrt(q.shape[-1])
        form = path_scores if q.shape[-2] == 1 else path_scores_ut  # decoding: the direct one
        scores = form(q32, k32, w, beta, start) / root
        return scores - q32 @ k32.transpose(-2, -1) / root  # the kernel adds q.k and M
