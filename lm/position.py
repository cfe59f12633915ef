"""Position schemes as parts, as in the notes' "Position tells the model where a matching token
occurred".

The notes give two ways a position enters a transformer, "add position features, or rotate
query/key features using their positions"; ALiBi adds a third, a bias on the scores. Each scheme
is one small part that says where it acts:

==================  ==========================  ==============================================
acts on             scheme                      what it does
==================  ==========================  ==============================================
embeddings          ``sinusoidal``, ``learned``  ``x_l = E[w_l] + p_l``
queries and keys    ``rope``                    pair i of q_l and k_l rotated by ``l theta_i``
scores              ``alibi``                   ``S_lj - m_h |l - j|``
scores              ``t5``                      ``S_lj + b_h[bucket(l - j)]``, b learned
scores              ``kerple``                  ``S_lj - r1_h log(1 + r2_h |l - j|)``, r learned
scores              ``fire``                    ``S_lj + f_h(psi(l - j) / psi(max(L, l)))``
nothing             ``none``                    only the causal mask orders the tokens
==================  ==========================  ==============================================

ALiBi, T5's and KERPLE's biases are functions of the distance ``l - j``; FIRE's (a learned MLP
``f``) also of the query position, which it divides the distance by. Each names its paper and
says whether its parameters are shared across layers.

A part overrides only the hooks of its place, and the model and attention call every hook
without asking which scheme they hold: ``embed`` (the model, once, on ``E[w]``), ``prepare``
(the model, once per forward pass, by the first part of each kind: what the layers share, such as
RoPE's cos and sin), and ``rotate`` and ``bias`` (each attention layer). A new scheme is a new
part in :data:`SCHEMES`. Each attention layer builds its own part (``attention_part(config,
layer)``), so a part knows its layer.

Every scheme counts real tokens only: padding takes no position and each packed document starts
again at 0 (``positions_from_mask``, ``positions_from_segments``). RoPE can also rotate only the
first pairs of each head (partial RoPE) and be extended past its trained context by Position
Interpolation, NTK-aware scaling or YaRN (:class:`Rope`; each method's function gives its
formula and source).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from lm.config import LMError, ModelConfig

if TYPE_CHECKING:
    from lm.plan import Bias, Plan


class PositionOutOfRange(LMError):
    """A learned position table has no row for this position."""


class Scheme(nn.Module):
    """A position scheme's part: every hook does nothing, so this is also ``none``, where only
    the causal mask breaks the permutation symmetry (notes, "Self-attention without positions
    is permutation equivariant")."""

    acts_on = "nothing"
    """embeddings | queries and keys | scores | nothing."""

    def __init__(self, config: ModelConfig | None = None, layer: int | None = None):
        super().__init__()

    def embed(self, x: torch.Tensor, plan: Plan) -> torch.Tensor:
        """``x [B, T, d]`` (the token embeddings) with the position added, for this scheme."""
        return x

    def prepare(self, plan: Plan) -> Plan:
        """The plan with what every layer of this scheme shares in one forward pass."""
        return plan

    def rotate(self, x: torch.Tensor, plan: Plan) -> torch.Tensor:
        """Queries or keys ``[B, H, T, d_k]`` as attention scores them."""
        return x

    def bias(self, plan: Plan) -> Bias | None:
        """What this scheme adds to the scores ``S``, in the form the plan's kernel takes."""
        return None


# The notes' two schemes: additive sinusoids and RoPE.


def sinusoidal_table(
    length: int,
    d: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The notes' fixed sinusoids, ``[length, d]``: ``p[l, 2i] = sin(l w_i)``, ``p[l, 2i+1] =
    cos(l w_i)``, ``w_i = 10000^(-2i/d)``; ``d`` must be even."""
    if d % 2:
        raise ValueError(f"sinusoidal_table needs an even width, got d={d}")
    positions = torch.arange(length, device=device, dtype=torch.float64)[:, None]  # (L, 1)
    omega = 10000.0 ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d)  # (d/2,)
    angles = positions * omega  # (L, d/2): column i is l * w_i
    table = torch.empty(length, d, device=device, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.to(dtype)


class Sinusoidal(Scheme):
    """``x_l = E[w_l] + p_l`` with the notes' fixed sinusoids, which extend to any length.

    With ``model.scale_embeddings`` the token embedding is ``sqrt(d) E[w_l]`` instead (Vaswani et
    al. 2017), so that a token's identity (entries of about 0.02 at initialisation) does not
    drown in its position (entries of about 1).
    """

    acts_on = "embeddings"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config)
        self.d = config.d_model
        self.scale = math.sqrt(self.d) if config.scale_embeddings else 1.0
        self.register_buffer("table", sinusoidal_table(config.position_range, self.d), False)

    def embed(self, x: torch.Tensor, plan: Plan) -> torch.Tensor:
        table = self.table
        if plan.end > table.shape[0]:  # past the trained context: the same formula, computed
            table = sinusoidal_table(plan.end, self.d, device=table.device)
        p = table[plan.positions].to(x.dtype)  # (T, d) or (B, T, d)
        return x * self.scale + p if self.scale != 1.0 else x + p


class Learned(nn.Embedding, Scheme):
    """``x_l = E[w_l] + P[l]`` with a learned table ``P`` of one row per trained position (GPT-2),
    which has nothing to say past the last one. An ``nn.Embedding``, initialised as one."""

    acts_on = "embeddings"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        nn.Embedding.__init__(self, config.position_range, config.d_model)

    def embed(self, x: torch.Tensor, plan: Plan) -> torch.Tensor:
        if plan.end > self.num_embeddings:  # bounded without reading positions (a GPU stall)
            raise PositionOutOfRange(
                f"learned positions cover 0..{self.num_embeddings - 1}; position {plan.end - 1} "
                "has no trained vector (use a shorter context)"
            )
        return x + F.embedding(plan.positions, self.weight)


def rope_frequencies(
    head_dim: int,
    base: float = 10000.0,
    pairs: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The notes' ``theta_i = base^(-2i/d)`` for each of a head's ``head_dim/2`` pairs, float64.

    Partial RoPE (``pairs`` < ``head_dim/2``): the first ``pairs`` pairs rotate, with ``d`` their
    width ``2 * pairs`` so that their frequencies still span ``1 .. 1/base`` (GPT-NeoX's
    ``rotary_pct``); the other pairs get frequency 0, so they are never rotated.
    """
    d = head_dim if pairs is None else 2 * pairs
    theta = base ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d)
    if d < head_dim:
        theta = torch.cat([theta, theta.new_zeros((head_dim - d) // 2)])
    return theta


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair ``(x[..., 2i], x[..., 2i+1])`` by ``R(alpha_i)``; cos/sin ``[..., L, d/2]``.

    ``R(a) = [[cos a, -sin a], [sin a, cos a]]`` acting on the column ``(x_2i, x_2i+1)``.
    Per-sequence angles ``[B, L, d/2]`` meet per-head ``x [B, H, L, d]`` across the head axis.
    """
    if cos.dim() == 3 and x.dim() == 4:
        cos, sin = cos[:, None], sin[:, None]
    # Half precision inputs rotate in float32, as the angles' digits matter more than speed here.
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    # Pair i as the complex number x_2i + i x_2i+1: R(a) acting on it is the product with e^(ia),
    # (x_2i cos a - x_2i+1 sin a) + i (x_2i sin a + x_2i+1 cos a), one fused product. (Read in
    # place: the pairs of a view of even strides, as q and k are, are complex numbers already.)
    pairs = torch.view_as_complex(work.unflatten(-1, (-1, 2)))  # (..., L, d/2)
    rotated = pairs * torch.complex(cos.to(work.dtype), sin.to(work.dtype))
    return torch.view_as_real(rotated).flatten(-2).to(x.dtype)


def pi_positions(positions: torch.Tensor, factor: float) -> torch.Tensor:
    """Position Interpolation (Chen et al. 2023, "Extending Context Window of Large Language
    Models via Positional Interpolation"): every position ``m`` becomes ``m / s``, so a context
    ``s`` times the trained one is squeezed into the angles the model saw in training."""
    return positions.to(torch.float64) / factor


def ntk_base(base: float, factor: float, rotated_dim: int) -> float:
    """NTK-aware scaling (bloc97, r/LocalLLaMA, 2023): the base becomes ``base * s^(d/(d-2))``
    with ``d`` the rotated width. The fastest pair keeps its frequency (it tells neighbours
    apart) and the slowest is divided by ``s`` (it then spans ``s`` times the context), with
    the pairs between interpolated less the faster they turn."""
    if rotated_dim <= 2:  # one pair: theta_0 = base^0 = 1 whatever the base
        return base
    return base * factor ** (rotated_dim / (rotated_dim - 2))


def yarn_frequencies(
    theta: torch.Tensor, factor: float, context: int, alpha: float = 1.0, beta: float = 32.0
) -> torch.Tensor:
    """YaRN's "NTK-by-parts" frequencies (Peng et al. 2024, "YaRN: Efficient Context Window
    Extension of Large Language Models", section 3.2).

    A pair of frequency ``theta_i`` has wavelength ``lambda_i = 2 pi / theta_i`` and turns
    ``r_i = L / lambda_i`` times over the trained context ``L``. The ramp ``gamma_i`` is 0 for
    ``r_i < alpha``, 1 for ``r_i > beta`` and ``(r_i - alpha) / (beta - alpha)`` between, and
    ``theta_i' = (1 - gamma_i) theta_i / s + gamma_i theta_i``: pairs that turn many times over
    the context are left alone, those that turn less than once are interpolated as PI does.
    """
    turns = context * theta / (2 * math.pi)  # r_i = L / lambda_i; an unrotated pair: 0
    gamma = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1 - gamma) * theta / factor + gamma * theta


def yarn_attention_factor(factor: float) -> float:
    """YaRN's attention temperature (Peng et al. 2024, section 3.4): the logits ``q.k`` are
    multiplied by ``1/t`` with ``sqrt(1/t) = 0.1 ln s + 1``, applied here to q and to k alike
    (in cos and sin), so the KV cache and every attention kernel see the same scaled keys."""
    return 0.1 * math.log(factor) + 1.0


@dataclass(frozen=True)
class Rope:
    """How RoPE turns positions into angles for one head width: the notes' rotation, partial
    rotation, and a context extension (``method`` none | pi | ntk | yarn, factor ``s``, and the
    trained context ``context`` that YaRN's ramp needs). ``none`` or a factor of 1 is the
    notes' RoPE exactly."""

    head_dim: int
    base: float = 10000.0
    pairs: int | None = None
    """Pairs rotated (the first ones); None: all."""
    method: str = "none"
    factor: float = 1.0
    context: int | None = None

    def __post_init__(self) -> None:
        if self.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of features; got an odd width {self.head_dim}")

    @classmethod
    def of(cls, c: ModelConfig) -> Rope:
        """RoPE's angles as a model config sets them."""
        pairs = None if c.rope_fraction == 1.0 else c.rope_pairs
        return cls(c.head_dim, c.rope_base, pairs, c.rope_method, c.rope_factor, c.rope_context)

    @property
    def extended(self) -> bool:
        return self.method != "none" and self.factor != 1.0

    def frequencies(self, device: torch.device | str | None = None) -> torch.Tensor:
        """``theta_i'`` of every pair, float64 ``[head_dim/2]`` (PI acts on positions instead)."""
        d = self.head_dim if self.pairs is None else 2 * self.pairs
        base = self.base
        if self.extended and self.method == "ntk":
            base = ntk_base(base, self.factor, d)
        theta = rope_frequencies(self.head_dim, base, self.pairs, device)
        if self.extended and self.method == "yarn":
            if self.context is None:
                raise ValueError("YaRN needs the trained context length")
            theta = yarn_frequencies(theta, self.factor, self.context)
        return theta

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the angles ``position * theta_i'``, ``positions.shape + (head_dim/2,)``.

        YaRN's temperature multiplies both, so rotating q and k scales their dot product by it.
        """
        theta = self.frequencies(positions.device)
        scaled = self.extended and self.method == "pi"
        where = pi_positions(positions, self.factor) if scaled else positions.to(torch.float64)
        angles = where[..., None] * theta  # (..., L, d_k/2)
        # Angles in float64: position * theta loses digits in float32 at long positions.
        cos, sin = torch.cos(angles), torch.sin(angles)
        if self.extended and self.method == "yarn":
            scale = yarn_attention_factor(self.factor)
            cos, sin = cos * scale, sin * scale
        return cos.to(dtype), sin.to(dtype)


class Rotary(Scheme):
    """RoPE: pair i of every query and key at position l rotated by ``l theta_i`` (values never
    are), so a query-key score depends on the offset ``s - l`` only (notes, "RoPE compares
    positions through angle differences"). cos and sin of the trained positions are computed
    once, kept as unsaved buffers; longer contexts are computed when asked for."""

    acts_on = "queries and keys"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config)
        self.rope = Rope.of(config)
        cos, sin = self.rope.cos_sin(torch.arange(config.position_range))  # (C, d_k/2) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def prepare(self, plan: Plan) -> Plan:
        """cos and sin at the plan's positions, looked up once for every layer (``plan.end``
        bounds the positions without a device read)."""
        if plan.end <= self.cos.shape[0]:
            angles = self.cos[plan.positions], self.sin[plan.positions]
        else:
            angles = self.rope.cos_sin(plan.positions)
        return dataclasses.replace(plan, rotation=angles)

    def rotate(self, x: torch.Tensor, plan: Plan) -> torch.Tensor:
        return rotate_pairs(x, *plan.rotation)


# A bias on the scores.


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


class Alibi(Scheme):
    """ALiBi (Press et al. 2022, "Train Short, Test Long"): head h adds ``-m_h |l - j|`` to the
    score of query position l and key position j, with fixed slopes ``m_h``. The bias depends on
    positions alone, so it is built once per forward pass and shared by the layers."""

    acts_on = "scores"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)

    def score(self, head: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """The bias of head(s) ``head`` at query and key positions (broadcast together)."""
        return -self.slopes[head] * (query - key).abs()

    def prepare(self, plan: Plan) -> Plan:
        return plan.sharing(Alibi, plan.score_bias(self.score))

    def bias(self, plan: Plan) -> Bias | None:
        return plan.biases[Alibi]


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


class T5Bias(Scheme):
    """T5's relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer
    Learning with a Unified Text-to-Text Transformer", section 2.1): head h adds a learned scalar
    ``b_h[bucket(l - j)]`` to the score of query l and key j, one per bucket of distance
    (:func:`t5_bucket`, causal buckets: a decoder reads only keys behind it), ``model.t5_buckets``
    buckets (the paper's 32) up to ``model.t5_max_distance`` (128).

    Shared across layers: the paper shares one table among all layers ("we also share the
    position embedding parameters across all layers in our model, though within a given layer
    each attention head uses a different learned position embedding"), and so does lm: the first
    layer using ``t5`` holds the table ``[heads, buckets]`` (as transformers' T5 does) and builds
    the bias once per forward pass; the other ``t5`` layers read it from the plan. T5 adds the
    bias to the unscaled logits ``q·k`` (its initialisation absorbs 1/sqrt(d_k)); lm adds it to
    ``S = q·k / sqrt(d_k)``, as every score bias here. The table starts as transformers' T5
    starts it, normal with std ``d_model^-0.5``.
    """

    acts_on = "scores"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config)
        self.buckets, self.max_distance = config.t5_buckets, config.t5_max_distance
        if layer is None or layer == config.layer_positions.index("t5"):
            table = torch.empty(config.n_head, self.buckets).normal_(std=config.d_model**-0.5)
            self.table = nn.Parameter(table)

    def score(self, head: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """``b_head[bucket(query - key)]`` (broadcast together)."""
        return self.table[head, t5_bucket(query - key, self.buckets, self.max_distance)]

    def prepare(self, plan: Plan) -> Plan:
        return plan.sharing(T5Bias, plan.score_bias(self.score))

    def bias(self, plan: Plan) -> Bias | None:
        return plan.biases[T5Bias]


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


class Kerple(Scheme):
    """KERPLE, logarithmic variant (Chi et al. 2022, "KERPLE: Kernelized Relative Positional
    Embedding for Length Extrapolation", the "log" kernel): head h adds ``-r1_h log(1 + r2_h
    |l - j|)`` to the score of query l and key j, with ``r1_h, r2_h > 0`` learned.

    Per layer: each layer has its own ``r1, r2`` (the paper's code builds them in every attention
    layer), so each layer computes its own bias in ``bias``. The paper's code starts them at
    ``U(0, 2)`` and ``U(0, 1)`` and, before every forward pass, clamps them in place to at least
    0.01; lm starts them so and uses ``max(r, 0.01)`` in the formula (the same numbers) with the
    gradient passed on unclamped (:func:`positive`), leaving the parameters untouched inside a
    forward pass.
    """

    acts_on = "scores"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config)
        self.r1 = nn.Parameter(torch.rand(config.n_head) * 2)
        self.r2 = nn.Parameter(torch.rand(config.n_head))

    def score(self, head: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """The bias of head(s) ``head`` at query and key positions (broadcast together)."""
        return kerple_log(positive(self.r1), positive(self.r2), head, query, key)

    def bias(self, plan: Plan) -> Bias | None:
        # r1, r2 made positive once, outside FlexAttention's score function (which computes
        # scalars only: no tensor of its own)
        return plan.score_bias(functools.partial(kerple_log, positive(self.r1), positive(self.r2)))


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
    psi_d = torch.log((c * (i - j)).abs() + 1)
    psi_i = torch.log((c * torch.maximum(i, threshold)).abs() + 1) + 1e-6
    x = psi_d / psi_i  # in [0, 1] for j <= i: progressive interpolation
    w1, b1, w2, b2 = mlp
    out = b2[head]
    for k in range(w1.shape[0]):
        out = out + w2[head, k] * torch.relu(w1[k] * x + b1[k])
    return out


class Fire(Scheme):
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

    acts_on = "scores"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config)
        W, H = config.fire_width, config.n_head
        self.w1 = nn.Parameter(torch.empty(W).uniform_(-1.0, 1.0))  # nn.Linear(1, W): fan-in 1
        self.b1 = nn.Parameter(torch.empty(W).uniform_(-1.0, 1.0))
        bound = 1 / math.sqrt(W)  # nn.Linear(W, H)
        self.w2 = nn.Parameter(torch.empty(H, W).uniform_(-bound, bound))
        self.b2 = nn.Parameter(torch.empty(H).uniform_(-bound, bound))
        self.c = nn.Parameter(torch.tensor([0.1]))
        self.threshold_scale = nn.Parameter(torch.tensor([1.0]))  # s
        self.threshold_init = float(config.fire_threshold)  # L0

    def formula_arguments(self) -> tuple:
        """c, L and the MLP as :func:`fire_bias` takes them, computed once per forward pass."""
        threshold = (self.threshold_scale * self.threshold_init).abs()[0]
        return self.c[0], threshold, (self.w1, self.b1, self.w2, self.b2)

    def score(self, head: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """The bias of head(s) ``head`` at query and key positions (broadcast together)."""
        return fire_bias(*self.formula_arguments(), head, query, key)

    def bias(self, plan: Plan) -> Bias | None:
        return plan.score_bias(functools.partial(fire_bias, *self.formula_arguments()))


SCHEMES: dict[str, type[Scheme]] = {
    "rope": Rotary,
    "sinusoidal": Sinusoidal,
    "learned": Learned,
    "alibi": Alibi,
    "t5": T5Bias,
    "kerple": Kerple,
    "fire": Fire,
    "none": Scheme,
}
"""Every ``model.position``, by name."""

POSITIONS = tuple(SCHEMES)


def embedding_part(config: ModelConfig) -> Scheme:
    """What the model adds to the token embeddings: the scheme's part if it acts there (a scheme
    that does is never chosen per layer, so layer 0's scheme is every layer's)."""
    part = SCHEMES[config.layer_positions[0]]
    return part(config) if part.acts_on == "embeddings" else Scheme(config)


def attention_part(config: ModelConfig, layer: int = 0) -> Scheme:
    """What attention layer ``layer`` does with positions: its scheme's part if it acts there."""
    part = SCHEMES[config.layer_positions[layer]]
    if part.acts_on in ("queries and keys", "scores"):
        return part(config, layer)
    return Scheme(config, layer)


# Where each token sits.


def positions_from_mask(key_mask: torch.Tensor, start: torch.Tensor | int = 0) -> torch.Tensor:
    """Positions that count real tokens only: ``[B, L]``, pads get the position of the next one.

    ``start`` (an int or ``[B]``) is each row's count of real tokens before these, for decoding.
    """
    start = torch.as_tensor(start, device=key_mask.device).reshape(-1, 1)
    return (start + key_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def random_positions(
    batch: int,
    length: int,
    limit: int,
    key_mask: torch.Tensor | None = None,
    segments: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
    Generalization of Transformers"): every run of tokens that counts its positions from 0 (a
    row's real tokens, or one document of a packed row) gets, for its n positions, n distinct
    integers drawn at random from ``[0, limit)`` and sorted, instead of ``0 .. n-1``. So a model
    trained on short sequences has seen the positions of sequences up to ``limit``. ``[batch,
    length]``, drawn from torch's generator (a checkpoint keeps its state).

    lm draws them in training only (``build_plan``); evaluation and sampling read ``0 .. n-1``.
    The paper's code (google-deepmind/randomized_positional_encodings) draws them at every call,
    evaluation included, and one draw per batch rather than per sequence."""
    starts = torch.zeros(batch, length, dtype=torch.bool, device=device)
    for marks in (key_mask, segments):  # a run ends where padding or the document changes
        if marks is not None:
            starts[:, 1:] |= marks[:, 1:] != marks[:, :-1]
    run = starts.long().cumsum(dim=1) * limit  # (B, T): orders the runs, in row order
    draw = torch.rand(batch, limit, device=device).argsort(dim=1)[:, :length]  # distinct
    return (run + draw).sort(dim=1).values - run  # each run's own draws, ascending


def positions_from_segments(segment_ids: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 where the segment id changes, ``[B, L]``."""
    B, L = segment_ids.shape
    index = torch.arange(L, device=segment_ids.device).expand(B, L)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first
