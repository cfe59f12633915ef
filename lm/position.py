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
"""

from __future__ import annotations

import math

import torch


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


def rope_cos_sin(
    positions: torch.Tensor,
    head_dim: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles ``position * theta_i``, shape ``positions.shape + (head_dim/2,)``.

    Computed once per forward pass and shared by every layer.
    """
    theta = base ** (
        -torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim
    )
    angles = positions.to(torch.float64)[..., None] * theta  # (..., L, d_k/2)
    # Angles in float64: position * theta loses digits in float32 at long positions.
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


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


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE on queries or keys ``x [..., L, d_k]`` at integer positions ``[L]`` or ``[B, L]``."""
    if x.shape[-1] % 2:
        raise ValueError(f"RoPE rotates pairs of features; got an odd width {x.shape[-1]}")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos, sin = rope_cos_sin(positions, x.shape[-1], base, dtype)
    return rotate_pairs(x, cos, sin)


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
