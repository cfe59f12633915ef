"""RoPE (Su et al. 2021, "RoFormer"; notes, "RoPE rotates query and key pairs by their
positions"): pair i of every query and key at position l rotated by ``l theta_i``, so that a
query-key score depends on the offset only. Also partial RoPE (only the first pairs rotate) and
three ways to extend a RoPE model past its trained context: Position Interpolation, NTK-aware
scaling and YaRN, each function with its formula and source. :class:`RopeAngles` turns positions
into angles; :class:`RoPE` is the scheme."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lm.config.errors import ConfigError
from lm.config.names import XPOS_REACH
from lm.config.sections import ModelConfig
from lm.model.masks import Positions
from lm.model.schemes.base import Scheme


def rope_frequencies(
    head_dim: int,
    base: float = 10000.0,
    pairs: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The notes' ``theta_i = base^(-2i/d)`` for each of a head's ``head_dim/2`` pairs, float64;
    partial RoPE for ``pairs`` < ``head_dim/2`` (:meth:`RopeAngles.frequencies`)."""
    return RopeAngles(head_dim, base, pairs).frequencies(device)


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
    theta: torch.Tensor, factor: float, context: int | None, alpha: float = 1.0, beta: float = 32.0
) -> torch.Tensor:
    """YaRN's "NTK-by-parts" frequencies (Peng et al. 2024, "YaRN: Efficient Context Window
    Extension of Large Language Models", section 3.2).

    A pair of frequency ``theta_i`` has wavelength ``lambda_i = 2 pi / theta_i`` and turns
    ``r_i = L / lambda_i`` times over the trained context ``L``. The ramp ``gamma_i`` is 0 for
    ``r_i < alpha``, 1 for ``r_i > beta`` and ``(r_i - alpha) / (beta - alpha)`` between, and
    ``theta_i' = (1 - gamma_i) theta_i / s + gamma_i theta_i``: pairs that turn many times over
    the context are left alone, those that turn less than once are interpolated as PI does.
    """
    if context is None:
        raise ValueError("YaRN needs the trained context length")
    turns = context * theta / (2 * math.pi)  # r_i = L / lambda_i; an unrotated pair: 0
    gamma = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1 - gamma) * theta / factor + gamma * theta


def yarn_attention_factor(factor: float) -> float:
    """YaRN's attention temperature (Peng et al. 2024, section 3.4): the logits ``q.k`` are
    multiplied by ``1/t`` with ``sqrt(1/t) = 0.1 ln s + 1``, applied here to q and to k alike
    (in cos and sin), so the KV cache and every attention kernel see the same scaled keys."""
    return 0.1 * math.log(factor) + 1.0


@dataclass(frozen=True)
class RopeAngles:
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
    kept: int | None = None
    """p-RoPE: pairs that rotate (the fastest, at their own frequencies); None: all."""

    def frequencies(self, device: torch.device | str | None = None) -> torch.Tensor:
        """``theta_i' = base^(-2i/d)`` of every pair, float64 ``[head_dim/2]`` (PI moves the
        positions instead). Partial RoPE: the first ``pairs`` pairs, ``d = 2 pairs`` so that they
        still span ``1 .. 1/base`` (GPT-NeoX's ``rotary_pct``); the other pairs at 0."""
        if self.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of features; got an odd width {self.head_dim}")
        d = self.head_dim if self.pairs is None else 2 * self.pairs
        extended = self.method != "none" and self.factor != 1.0
        ntk = extended and self.method == "ntk"
        base = ntk_base(self.base, self.factor, d) if ntk else self.base
        theta = base ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d)
        theta = torch.cat([theta, theta.new_zeros((self.head_dim - d) // 2)])  # partial: 0s
        if self.kept is not None:  # p-RoPE: the slowest pairs' frequencies become 0
            theta = torch.cat([theta[: self.kept], theta.new_zeros(len(theta) - self.kept)])
        if extended and self.method == "yarn":
            theta = yarn_frequencies(theta, self.factor, self.context)
        return theta

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the angles ``position * theta_i'``, ``positions.shape + (head_dim/2,)``,
        both times YaRN's temperature (so rotating q and k scales their product by it)."""
        theta = self.frequencies(positions.device)
        extended = self.method != "none" and self.factor != 1.0
        scaled = extended and self.method == "pi"
        where = pi_positions(positions, self.factor) if scaled else positions.to(torch.float64)
        angles = where[..., None] * theta  # (..., L, d_k/2)
        # Angles in float64: position * theta loses digits in float32 at long positions.
        cos, sin = torch.cos(angles), torch.sin(angles)
        if extended and self.method == "yarn":
            scale = yarn_attention_factor(self.factor)
            cos, sin = cos * scale, sin * scale
        return cos.to(dtype), sin.to(dtype)


class RoPE(Scheme):
    """RoPE: pair i of every query and key at position l rotated by ``l theta_i`` (values never
    are), so a query-key score depends on the offset ``s - l`` only (notes, "RoPE compares
    positions through angle differences"). cos and sin of the trained positions are computed
    once, kept as unsaved buffers; longer contexts are computed when asked for."""

    name = "rope"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__()
        c = config  # RoPE's angles as the config sets them
        pairs = None if c.rope_fraction == 1.0 else c.rope_pairs
        kept = None if c.rope_p == 1.0 else c.rope_kept_pairs
        extension = () if c.rope_scaling is None else (c.rope_method, c.rope_factor, c.rope_context)
        self.rope = RopeAngles(c.head_dim, c.rope_base, pairs, *extension, kept=kept)
        cos, sin = self.rope.cos_sin(torch.arange(config.position_range))  # (C, d_k/2) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, where: Positions
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if where.limit <= self.cos.shape[0]:  # the trained positions: looked up
            cos, sin = self.cos[where.queries], self.sin[where.queries]
        else:
            cos, sin = self.rope.cos_sin(where.queries)
        return rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)


def xpos_decay(head_dim: int, gamma: float = 0.4) -> torch.Tensor:
    """xPos's per-pair decay base ``zeta_i = (2i/d + gamma) / (1 + gamma)`` (Sun et al. 2022,
    "A Length-Extrapolatable Transformer", arXiv 2212.10554, eq. 10), float64 ``[d/2]``: below 1,
    smallest for the fastest pair."""
    return (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim + gamma) / (1 + gamma)


def xpos_reach(scale_base: float) -> int:
    """How many positions (``0 .. reach - 1``) xPos computes in fp32 with this B."""
    return int(XPOS_REACH * scale_base)


class XPos(RoPE):
    """xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv 2212.10554, eq. 11): RoPE
    whose pair i of a query at position l is also scaled by ``zeta_i^(l/B)`` and of a key at
    position j by ``zeta_i^(-j/B)``, so that their score decays as ``zeta_i^((l - j)/B)`` with
    the distance, the fastest pairs the most (``B = model.xpos_scale_base``, the paper's 512).
    The scales come with RoPE's angles, as scaled cos and sin, computed in float64. The paper's
    code centres the positions on the middle of each sequence to keep the factors small; lm
    keeps them absolute (a key's scale must not change once it is in the KV cache), so its
    fastest pair's key scale ``zeta_0^(-j/B)`` grows as ``e^(1.25 j/B)`` and leaves fp32's range
    (3.4e38) near ``j = 70 B``: positions from ``XPOS_REACH`` B on are refused
    (:func:`xpos_reach`), not computed as inf and nan."""

    name = "xpos"

    def __init__(self, config: ModelConfig, layer: int | None = None):
        super().__init__(config, layer)
        self.scale_base = config.xpos_scale_base
        reach = xpos_reach(self.scale_base)
        if config.position_range > reach:
            raise ConfigError(
                f"model.xpos_scale_base: {self.scale_base:g} keeps xPos's scales finite up to "
                f"position {reach} ({XPOS_REACH} B); training reads {config.position_range}"
            )
        self.register_buffer("decay", xpos_decay(config.head_dim), persistent=False)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, where: Positions
    ) -> tuple[torch.Tensor, torch.Tensor]:
        reach = xpos_reach(self.scale_base)
        if where.limit > reach:  # a host int: no device read
            raise ConfigError(
                f"model.xpos_scale_base: {self.scale_base:g} keeps xPos's scales finite up to "
                f"position {reach} ({XPOS_REACH} B); this pass reaches {where.limit - 1}"
            )
        cos, sin = self.rope.cos_sin(where.queries, torch.float64)  # (..., L, d_k/2)
        scale = self.decay.to(cos.device) ** (
            where.queries.to(torch.float64)[..., None] / self.scale_base
        )
        cos_q, sin_q = (cos * scale).float(), (sin * scale).float()  # zeta^(l/B) on the queries
        cos_k, sin_k = (cos / scale).float(), (sin / scale).float()  # zeta^(-j/B) on the keys
        return rotate_pairs(q, cos_q, sin_q), rotate_pairs(k, cos_k, sin_k)
