"""Position as a bias on the scores, ``A = softmax(S + B + M)``: ALiBi (fixed slopes), T5
(learned buckets of distance), KERPLE (a learned logarithmic kernel), FIRE (a learned MLP of
the normalised distance) and Sandwich (inner products of the notes' sinusoids). Each names its
paper and says whether its parameters are shared across layers. Each writes its bias as the
paper does, a plain function ``formula(*parameters, head, query, key)``, and
:class:`~lm.model.schemes.base.ScoreBias` puts it in the form the kernel takes."""

from __future__ import annotations

import math

import torch
from torch import nn

from lm.config.sections import ModelConfig
from lm.model.masks import Positions
from lm.model.schemes.base import ScoreBias
from lm.model.schemes.embeddings import frequencies


def alibi_slopes(n_head: int) -> torch.Tensor:
    """ALiBi's per-head slopes: the geometric sequence 2^(-8/n), 2^(-16/n), ... (Press et al.).

    For a head count that is not a power of two, the paper's recipe: the slopes of the closest
    smaller power of two, then every other slope of the next power of two.
    """

    def powers(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_head).is_integer():
        slopes = powers(n_head)
    else:
        lower = 2 ** math.floor(math.log2(n_head))
        slopes = powers(lower) + powers(2 * lower)[0::2][: n_head - lower]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(
    slopes: torch.Tensor, head: torch.Tensor, query: torch.Tensor, key: torch.Tensor
) -> torch.Tensor:
    """ALiBi's bias ``-m_h |query - key|`` (``slopes`` ``[H]``)."""
    return -slopes[head] * (query - key).abs()


class ALiBi(ScoreBias):
    """ALiBi (Press et al. 2022, "Train Short, Test Long"): head h adds ``-m_h |l - j|`` to the
    score of query position l and key position j, with fixed slopes ``m_h``. The bias depends on
    positions alone, so it is built once per forward pass and shared by the layers."""

    name = "alibi"
    one_bias = True
    formula = staticmethod(alibi_bias)

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config, layer)
        self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)

    def arguments(self, where: Positions) -> tuple:
        return (self.slopes,)


def t5_bucket(distance: torch.Tensor, buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's causal ("unidirectional") bucket of the distance ``n = l - j`` from key j back to
    query l (Raffel et al. 2020, section 2.1; Mesh TensorFlow's ``_relative_position_bucket``
    with ``bidirectional=False``): the first ``buckets // 2`` buckets hold one distance each,
    ``0 .. buckets//2 - 1``; the others split ``buckets//2 .. max_distance`` on a logarithmic
    scale, ``buckets//2 + floor(log(n / (buckets//2)) / log(max_distance / (buckets//2)) *
    (buckets - buckets//2))``, and every longer distance shares the last bucket. A key after
    its query (n < 0, hidden by the causal mask) falls in bucket 0."""
    n = distance.clamp(min=0)
    exact = buckets // 2
    scale = (buckets - exact) / math.log(max_distance / exact)
    # float32, as the reference computes it; clamped to 1 so that log never sees 0 (unused there)
    far = exact + (torch.log(n.float().clamp(min=1.0) / exact) * scale).long()
    return torch.where(n < exact, n, far.clamp(max=buckets - 1))


def t5_bias(
    table: torch.Tensor,
    buckets: int,
    max_distance: int,
    head: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
) -> torch.Tensor:
    """T5's bias ``b_head[bucket(query - key)]`` from the learned ``table`` ``[H, buckets]``."""
    bucket = t5_bucket(query - key, buckets, max_distance)
    if bucket.dim() == 0:  # FlexAttention's score function: one score at a time
        return table[head, bucket]
    # index_select, whose gradient (index_add) sums in one order on any number of threads;
    # indexing's (index_put with accumulate) sums in parts that depend on the thread count.
    index = (head * buckets + bucket).reshape(-1)
    shape = torch.broadcast_shapes(head.shape, bucket.shape)
    return table.reshape(-1).index_select(0, index).view(shape)


class T5(ScoreBias):
    """T5's relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer
    Learning with a Unified Text-to-Text Transformer", section 2.1): head h adds a learned scalar
    ``b_h[bucket(l - j)]`` to the score of query l and key j, one per bucket of distance
    (:func:`t5_bucket`, causal buckets: a decoder reads only keys behind it), ``model.t5_buckets``
    buckets (the paper's 32) up to ``model.t5_max_distance`` (128).

    Shared across layers: the paper shares one table among all layers ("we also share the
    position embedding parameters across all layers in our model, though within a given layer
    each attention head uses a different learned position embedding"), and so does lm: the first
    layer using ``t5`` holds the table ``[heads, buckets]`` (as transformers' T5 does) and the
    model builds the bias from it once per forward pass for every ``t5`` layer
    (``Positions.biases``). T5 adds the bias to the unscaled logits ``q·k`` (its initialisation
    absorbs 1/sqrt(d_k)); lm adds it to ``S = q·k / sqrt(d_k)``, as every score bias here. The
    table starts as transformers' T5 starts it, normal with std ``d_model^-0.5``.
    """

    name = "t5"
    one_bias = True
    formula = staticmethod(t5_bias)

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config, layer)
        self.buckets, self.max_distance = config.t5_buckets, config.t5_max_distance
        if layer is None or layer == config.layer_positions.index(self.row.name):
            table = torch.empty(config.n_head, self.buckets).normal_(std=config.d_model**-0.5)
            self.table = nn.Parameter(table)

    def arguments(self, where: Positions) -> tuple:
        return self.table, self.buckets, self.max_distance


def positive(r: torch.Tensor, floor: float = 0.01) -> torch.Tensor:
    """``r`` clamped to at least ``floor`` in value, its gradient passed on as if unclamped: a
    learned scalar kept positive without editing the parameter inside a forward pass."""
    return r + (r.clamp(min=floor) - r).detach()


def kerple_log(
    r1: torch.Tensor, r2: torch.Tensor, head: torch.Tensor, query: torch.Tensor, key: torch.Tensor
) -> torch.Tensor:
    """KERPLE's logarithmic bias ``-r1_h log(1 + r2_h |query - key|)`` (``r1``, ``r2``: ``[H]``,
    positive)."""
    return -r1[head] * torch.log1p(r2[head] * (query - key).abs())


class KERPLE(ScoreBias):
    """KERPLE, logarithmic variant (Chi et al. 2022, "KERPLE: Kernelized Relative Positional
    Embedding for Length Extrapolation", the "log" kernel): head h adds ``-r1_h log(1 + r2_h
    |l - j|)`` to the score of query l and key j, with ``r1_h, r2_h > 0`` learned.

    Per layer: each layer has its own ``r1, r2`` (the paper's code builds them in every attention
    layer), so each layer computes its own bias. The paper's code starts them at
    ``U(0, 2)`` and ``U(0, 1)`` and, before every forward pass, clamps them in place to at least
    0.01; lm starts them so and uses ``max(r, 0.01)`` in the formula (the same numbers) with the
    gradient passed on unclamped (:func:`positive`), leaving the parameters untouched inside a
    forward pass.
    """

    name = "kerple"
    formula = staticmethod(kerple_log)

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config, layer)
        self.r1 = nn.Parameter(torch.rand(config.n_head) * 2)
        self.r2 = nn.Parameter(torch.rand(config.n_head))

    def arguments(self, where: Positions) -> tuple:
        # made positive once, outside FlexAttention's score function (which computes scalars
        # only: no tensor of its own)
        return positive(self.r1), positive(self.r2)


def fire_bias(
    c: torch.Tensor,
    threshold: torch.Tensor,
    mlp: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    head: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
) -> torch.Tensor:
    """FIRE's bias ``f(psi(|i - j|) / psi(max(L, i)))`` of query position i and key position j,
    with ``psi(x) = log(|c x| + 1)`` and ``f`` the MLP ``mlp = (w1 [W], b1 [W], w2 [H, W], b2
    [H])``: ``f_h(x) = b2_h + sum_k w2_hk relu(w1_k x + b1_k)``. The MLP is written one hidden
    unit at a time, so that FlexAttention can run it inside its kernel, one score at a time
    (it compiles pointwise arithmetic, not a matrix product)."""
    i, j = query.float(), key.float()
    distance = i - j
    psi_d = torch.log((along(c, distance, -1) * distance).abs() + 1)
    psi_i = torch.log((along(c, i, -2) * torch.maximum(i, along(threshold, i, -2))).abs() + 1)
    x = psi_d / (psi_i + 1e-6)  # in [0, 1] for j <= i: progressive interpolation
    w1, b1, w2, b2 = mlp
    out = b2[head]
    for k in range(w1.shape[0]):
        out = out + w2[head, k] * torch.relu(along(w1[k], x, -1) * x + along(b1[k], x, -1))
    return out


def along(scalar: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    """A learned scalar spread along dimension ``dim`` of ``like`` (``[n]`` at -1, ``[n, 1]``
    at -2), which broadcasts like the scalar. Its gradient then sums ``like``'s other dimensions
    first and ``n`` numbers after: the same order on any number of threads, where one sum of a
    whole tensor into a scalar adds in parts that depend on the thread count. A 0-d ``like``
    (FlexAttention's score function) takes the scalar as it is."""
    if like.dim() < -dim:
        return scalar
    n = like.shape[dim]
    return scalar.expand(n) if dim == -1 else scalar.expand(n, 1)


class FIRE(ScoreBias):
    """FIRE (Li et al. 2024, "Functional Interpolation for Relative Positions Improves Long
    Context Transformers"): head h adds ``f_h(psi(i - j) / psi(max(L, i)))`` to the score of
    query position i and key position j, where ``psi(x) = log(c x + 1)`` amplifies short
    distances, dividing by ``psi`` of the query position maps every distance into [0, 1]
    whatever the length ("progressive interpolation"), the threshold L keeps short queries from
    being normalised by a small number, and ``f`` is a small learned MLP (``1 -> W -> H``, ReLU,
    ``model.fire_width`` W: the paper's 32), one output per head.

    As the paper's reference code: ``c`` is learned (starting at 0.1) and used as ``|c x|``;
    ``L = |s L0|`` with ``L0 = model.fire_threshold`` (the code's default, 512) and a learned
    multiplier s (starting at 1); the MLP starts as PyTorch's ``nn.Linear`` layers do; the
    normaliser has 1e-6 added. Per layer: each layer has its own MLP, c and L and computes its
    own bias (sharing one FIRE among all layers, as T5 shares its table, would save parameters
    and compute; lm does not).
    """

    name = "fire"
    formula = staticmethod(fire_bias)

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config, layer)
        W, H = config.fire_width, config.n_head
        self.w1 = nn.Parameter(torch.empty(W).uniform_(-1.0, 1.0))  # nn.Linear(1, W): fan-in 1
        self.b1 = nn.Parameter(torch.empty(W).uniform_(-1.0, 1.0))
        bound = 1 / math.sqrt(W)  # nn.Linear(W, H)
        self.w2 = nn.Parameter(torch.empty(H, W).uniform_(-bound, bound))
        self.b2 = nn.Parameter(torch.empty(H).uniform_(-bound, bound))
        self.c = nn.Parameter(torch.tensor([0.1]))
        self.threshold_scale = nn.Parameter(torch.tensor([1.0]))  # s
        self.threshold_init = float(config.fire_threshold)  # L0

    def arguments(self, where: Positions) -> tuple:
        """c, L and the MLP as :func:`fire_bias` takes them, computed once per forward pass."""
        threshold = (self.threshold_scale * self.threshold_init).abs()[0]
        return self.c[0], threshold, (self.w1, self.b1, self.w2, self.b2)


def sandwich_table(length: int, d: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The inner products of the notes' sinusoids at every distance ``n = 0 .. length - 1``:
    ``p_l . p_(l-n) = sum_i cos(n w_i)``, ``w_i = 10000^(-2i/d)`` (a function of the distance
    alone, since ``sin a sin b + cos a cos b = cos(a - b)``), minus ``d/2``, its value at distance
    0, so that a key's bias is 0 at the query and falls, with ripples, as it recedes. float64."""
    n = torch.arange(length, device=device, dtype=torch.float64)[:, None]
    return torch.cos(n * frequencies(d, device=device)).sum(dim=-1) - d / 2


def sandwich_bias(
    table: torch.Tensor,
    scales: torch.Tensor,
    head: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
) -> torch.Tensor:
    """Sandwich's bias: :func:`sandwich_table` at the distance, times head ``head``'s scale."""
    return table[(query - key).clamp(min=0)] * scales[head]  # a key after its query is masked


class Sandwich(ScoreBias):
    """Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of
    Receptive Field Analysis", ACL 2023, arXiv 2212.10356, section 5): the parameter-free bias
    of the inner product of the notes' sinusoids, ``p_l . p_j`` (:func:`sandwich_table`, width
    ``d_model``), scaled for head h = 1 .. H by ``H / (8 h)`` as in the authors' implementation
    (NeMo's ``sandwich_pos_bias``), so that each head decays at its own rate, as ALiBi's slopes
    do. It depends on the distance alone: built once per forward pass and shared by the layers.
    """

    name = "sandwich"
    one_bias = True
    formula = staticmethod(sandwich_bias)

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config, layer)
        self.d = config.d_model
        heads = torch.arange(1, config.n_head + 1, dtype=torch.float64)
        self.register_buffer("scales", config.n_head / (8 * heads), persistent=False)

    def arguments(self, where: Positions) -> tuple:
        # the table up to the positions' limit: no device read for its length
        table = sandwich_table(where.limit, self.d, where.queries.device).float()
        return table, self.scales.float()
