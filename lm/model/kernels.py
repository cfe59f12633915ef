"""``Y = softmax_row(S + B + M) V`` three ways, held equal to float tolerance by the tests: the
notes' formula written out (:func:`attention`, with :func:`softmax_rows`); PyTorch's fused SDPA,
whose mask-free causal path is flash attention on GPUs; and FlexAttention, which takes the mask
as a block mask (wholly blocked blocks are skipped) and a score bias as a function of (batch,
head, query, key), so no ``T x T`` tensor exists. ``lm.model.attention.attend`` calls the one
that runs, decided once per forward pass (:func:`choose_kernel`, called by
``lm.model.masks.masks``).

Which kernel runs. ``model.kernel: math`` runs the notes' formula; ``model.normalize:
stick_breaking`` runs its own formula, written out, whatever the kernel. FlexAttention needs no KV
cache, no attention dropout, a scheme it can compute (its row's ``flex``), and a backward pass where
gradients are on (none on CPU); ``sdpa`` picks it only for a mask or a score bias in a model
compiled for a GPU (on CPU it measured slower: docs/performance.md, "Masked attention"). On CPU,
the gradient of a learned bias (its row's ``learned_bias``), and of queries and keys wider than the
values (``wide_keys``), goes through the notes' formula: SDPA then runs PyTorch's own math path,
whose softmax backward sums in parts that depend on the thread count, so a run's numbers would too
(:func:`softmax_rows` sums each row whole). ``auto``, which ``lm train`` resolves before it builds a
model, runs as ``sdpa`` wherever a model is built with it unresolved."""

from __future__ import annotations

import functools
import math
from operator import attrgetter

import torch
import torch.nn.functional as F

from lm.config.sections import ModelConfig

try:  # PyTorch >= 2.5; without it, masks and biases go through SDPA as tensors
    from torch.nn.attention.flex_attention import flex_attention
except ImportError:  # pragma: no cover - the pinned PyTorch has it
    flex_attention = None

FLEX_AVAILABLE = flex_attention is not None


def softmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """``A = softmax_row(S + M)`` from the masked scores, subtracting each row's maximum first:
    the weights are unchanged and large scores cannot overflow ``exp``. A row with every key
    blocked gets all-zero weights, never NaN."""
    row_max = scores.amax(dim=-1, keepdim=True)
    # A row with every key blocked has max -inf; shifting by 0 keeps exp() at exactly 0 there.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def scores(
    q: torch.Tensor,
    k: torch.Tensor,
    M: torch.Tensor | None = None,
    B: torch.Tensor | None = None,
) -> torch.Tensor:
    """``S + B + M``, ``S = Q K^T / sqrt(d_k)``: q ``[..., Lq, d_k]``, k ``[..., Lk, d_k]``; a
    scheme's score bias ``B`` and the mask ``M``, additive (float: the notes' ``M``) or boolean
    (True = may attend), each broadcastable to ``[..., Lq, Lk]``."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # S: (..., Lq, Lk)
    s = s if B is None else s + B
    if M is None:
        return s
    return s.masked_fill(~M, float("-inf")) if M.dtype == torch.bool else s + M


def attention(q, k, v, mask=None, bias=None, dropout: float = 0.0):
    """Scaled dot-product attention, written out: returns ``(Y, A)``, ``A = softmax_row(S + B +
    M)`` (:func:`scores`, ``M`` the ``mask`` and ``B`` the ``bias``; v ``[..., Lk, d_v]``),
    ``Y = A V`` with ``dropout`` on ``A``."""
    weights = softmax_rows(scores(q, k, mask, bias))  # A
    return (F.dropout(weights, dropout) if dropout else weights) @ v, weights


def stick_breaking(q, k, v, mask=None, bias=None, dropout: float = 0.0):
    """Stick-breaking attention (Tan et al. 2025, "Scaling Stick-Breaking Attention", arXiv
    2410.17980, eq. 3), written out: returns ``(Y, A)`` with ``A_lj = sigma(z_lj) prod_{j < m <=
    l} (1 - sigma(z_lm))`` for ``z = S + B`` over the keys a boolean ``mask`` ``M`` allows
    (shapes as :func:`attention`). Each query breaks a stick from its nearest key back: key j
    takes the share ``sigma(z_lj)`` of what the keys after it left, so nearer keys come first and
    a row sums to at most 1 (what no key takes is read from nowhere). Computed in log space,
    ``log A_lj = log sigma(z_lj) + sum_{m > j} log sigma(-z_lm)``, a blocked key taking nothing
    and leaving everything."""
    z = scores(q, k, None, bias)  # (..., Lq, Lk)
    take, leave = F.logsigmoid(z), F.logsigmoid(-z)  # log sigma(z), log(1 - sigma(z))
    if mask is not None:
        take = take.masked_fill(~mask, float("-inf"))
        leave = leave.masked_fill(~mask, 0.0)
    after = leave.flip(-1).cumsum(dim=-1).flip(-1) - leave  # sum over the keys after each one
    weights = torch.exp(take + after)
    return (F.dropout(weights, dropout) if dropout else weights) @ v, weights


def choose_kernel(setting: str, config: ModelConfig, device, masked: bool, cache, training) -> str:
    """The kernel of a forward pass (``masked``: a mask or a score bias) for ``model.kernel``
    ``setting``: sdpa | flex | math, or stick_breaking (module docstring, "Which kernel runs")."""
    rows, grad, cpu = config.rows, torch.is_grad_enabled(), device.type == "cpu"
    if config.normalize == "stick_breaking":
        return "stick_breaking"
    # a learned bias's gradient, or keys wider than the values: the notes' formula on CPU
    formula = any(map(attrgetter("learned_bias"), rows)) or any(map(attrgetter("wide_keys"), rows))
    if setting == "math" or (cpu and grad and formula):
        return "math"
    compiled_gpu = device.type == "cuda" and torch.compiler.is_compiling()
    flex = (setting == "flex" or (masked and compiled_gpu)) and FLEX_AVAILABLE and cache is None
    flex = flex and all(map(attrgetter("flex"), rows)) and not (training and config.dropout)
    return "flex" if flex and (flex_backward(device) or not grad) else "sdpa"


def flex_backward(device: torch.device) -> bool:
    """Whether PyTorch's FlexAttention has a backward pass on this device (not on CPU)."""
    return device.type != "cpu"


def flex(q, k, v, score_mod=None, block_mask=None, enable_gqa=False) -> torch.Tensor:
    """FlexAttention, compiled: inside a compiled model as it is, otherwise compiled on its own
    (PyTorch's eager FlexAttention is a reference that builds every score, slower than SDPA
    with a mask). ``enable_gqa``: k and v hold fewer heads than q, each read by its group."""
    run = flex_attention if torch.compiler.is_compiling() else _compiled_flex()
    gqa = {"enable_gqa": True} if enable_gqa else {}
    return run(q, k, v, score_mod=score_mod, block_mask=block_mask, **gqa)


@functools.cache
def _compiled_flex():
    """``flex_attention`` compiled once. Shapes are static (one compilation per length):
    Inductor's CPU code for dynamic shapes fails to build in PyTorch 2.13."""
    return torch.compile(flex_attention, dynamic=False)


def per_query_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query keys or values ``[B, H_kv, L, d]`` as ``[B, heads, L, d]``: key/value head
    g repeated for the ``heads / H_kv`` query heads of its group (query head h reads head
    ``h // (heads / H_kv)``), for a formula that reads one key per query head. The tensor itself
    when there is one key/value head per query head already."""
    group = heads // t.shape[1]
    return t if group == 1 else t.repeat_interleave(group, dim=1)
