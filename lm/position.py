"""Position schemes, as in the notes' "Position tells the model where a matching token occurred".

Two of the five are the notes' own:

* ``sinusoidal`` -- additive: ``x_l = E[w_l] + p_l`` with ``p[l, 2i] = sin(l w_i)``,
  ``p[l, 2i+1] = cos(l w_i)``, ``w_i = 10000^(-2i/d)``.
* ``rope`` -- rotary: every interleaved query/key pair ``(x[2i], x[2i+1])`` at position ``l`` is
  rotated by the angle ``l theta_i``, ``theta_i = base^(-2i/d_k)``; values are never rotated.
  The score of a rotated query/key pair depends only on the offset ``s - l``.

The others make the comparison complete: ``learned`` (a learned absolute table, as GPT-2),
``alibi`` (a per-head linear distance penalty on the scores; Press et al. 2022, "Train Short,
Test Long") and ``none`` (no position signal; only the causal mask breaks permutation symmetry).

Every scheme counts real tokens only: padding takes no position and each packed document starts
again at 0 (``positions_from_mask``, ``positions_from_segments``).

RoPE can also rotate only the first pairs of each head (partial RoPE) and be extended past its
trained context by Position Interpolation, NTK-aware scaling or YaRN (:class:`Rope`; each
method's function gives its formula and source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


def sinusoidal_table(
    length: int,
    d: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The notes' fixed sinusoids, shape ``[length, d]``; ``d`` must be even."""
    if d % 2:
        raise ValueError(f"sinusoidal_table needs an even width, got d={d}")
    positions = torch.arange(length, device=device, dtype=torch.float64)[:, None]  # (L, 1)
    omega = 10000.0 ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d)  # (d/2,)
    angles = positions * omega  # (L, d/2): column i is l * w_i
    table = torch.empty(length, d, device=device, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.to(dtype)


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
    pairs = work.unflatten(-1, (-1, 2))  # (..., L, d/2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = cos.to(work.dtype), sin.to(work.dtype)
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


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

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on queries or keys ``x [..., L, d_k]`` at positions ``[L]`` or ``[B, L]``."""
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        return rotate_pairs(x, *self.cos_sin(positions, dtype))


class RopeCache(nn.Module):
    """cos and sin of positions ``0 .. length-1``, computed once and kept as (unsaved) buffers,
    so they follow the model to its device; longer contexts are computed when asked for."""

    def __init__(self, rope: Rope, length: int):
        super().__init__()
        self.rope = rope
        cos, sin = rope.cos_sin(torch.arange(length))  # (length, d_k/2) each
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, positions: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at ``positions``; ``top`` bounds them from above without reading the
        tensor (which would stall a GPU)."""
        if top <= self.cos.shape[0]:
            return self.cos[positions], self.sin[positions]
        return self.rope.cos_sin(positions)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
    """RoPE on queries or keys ``x [..., L, d_k]`` at positions ``[L]`` or ``[B, L]``; the
    notes' plain rotation unless ``rope`` says otherwise."""
    return (rope or Rope(x.shape[-1])).apply(x, positions)


def positions_from_mask(key_mask: torch.Tensor, start: torch.Tensor | int = 0) -> torch.Tensor:
    """Positions that count real tokens only: ``[B, L]``, pads get the position of the next one.

    ``start`` (an int or ``[B]``) is each row's count of real tokens before these, for decoding.
    """
    start = torch.as_tensor(start, device=key_mask.device).reshape(-1, 1)
    return (start + key_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def positions_from_segments(segment_ids: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 where the segment id changes, ``[B, L]``."""
    B, L = segment_ids.shape
    index = torch.arange(L, device=segment_ids.device).expand(B, L)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first


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
    slopes: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
) -> torch.Tensor:
    """Additive score bias ``-m_h |pos_q - pos_k|``, shape ``[B or 1, H, Lq, Lk]``.

    Positions are ``[L]`` or ``[B, L]``; a causal mask removes the future keys separately.
    """
    q = q_positions if q_positions.dim() == 2 else q_positions[None]
    k = k_positions if k_positions.dim() == 2 else k_positions[None]
    distance = (q[:, :, None] - k[:, None, :]).abs().to(torch.float32)  # (B, Lq, Lk)
    return -slopes.to(distance.device)[None, :, None, None] * distance[:, None]
