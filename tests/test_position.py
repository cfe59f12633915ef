"""RoPE and the sinusoid table, as the notes define them."""

import math

import torch

from lm.attention import MultiHeadAttention
from lm.position import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    positions_from_mask,
    positions_from_segments,
    sinusoidal_table,
)


def test_sinusoid_table_matches_the_formula():
    d, L = 8, 12
    p = sinusoidal_table(L, d, dtype=torch.float64)
    for pos in range(L):
        for i in range(d // 2):
            w = 10000 ** (-2 * i / d)
            assert math.isclose(p[pos, 2 * i].item(), math.sin(pos * w), abs_tol=1e-12)
            assert math.isclose(p[pos, 2 * i + 1].item(), math.cos(pos * w), abs_tol=1e-12)
    # The notes' d=4 picture: position 0 is [0, 1, 0, 1].
    torch.testing.assert_close(sinusoidal_table(6, 4)[0], torch.tensor([0.0, 1.0, 0.0, 1.0]))


def test_rope_rotates_interleaved_pairs_by_position_times_theta():
    dk = 4
    x = torch.tensor([[1.0, 0.0, 1.0, 0.0]]).double()
    out = apply_rope(x, torch.tensor([3]))
    for i in range(dk // 2):
        angle = 3 * 10000 ** (-2 * i / dk)
        assert math.isclose(out[0, 2 * i].item(), math.cos(angle), abs_tol=1e-6)
        assert math.isclose(out[0, 2 * i + 1].item(), math.sin(angle), abs_tol=1e-6)


def test_rope_scores_depend_only_on_the_offset_and_preserve_norms():
    torch.manual_seed(0)
    q, k = torch.randn(16).double(), torch.randn(16).double()

    def score(l, s):
        ql = apply_rope(q[None], torch.tensor([l]))[0]
        ks = apply_rope(k[None], torch.tensor([s]))[0]
        return (ql @ ks).item()

    for l, s in [(1, 3), (0, 7), (5, 2)]:
        for shift in (1, 10, 100):
            assert math.isclose(
                score(l, s), score(l + shift, s + shift), rel_tol=1e-9, abs_tol=1e-9
            )
    x = torch.randn(5, 16).double()
    rotated = apply_rope(x, torch.arange(5) * 13)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))


def test_rope_batch_positions_match_per_row_positions():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8)  # (B, H, L, d_k)
    pos = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]])
    out = apply_rope(x, pos)
    for b in range(2):
        torch.testing.assert_close(out[b], apply_rope(x[b], pos[b]))


def test_rope_is_applied_to_queries_and_keys_not_values():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 1, position="rope", kernel="math")
    x = torch.randn(1, 1, 8)
    # One token attends only to itself: weight 1, so the output is W_O v whatever the rotation.
    y, _ = mha(x, positions=torch.tensor([37]))
    y0, _ = mha(x, positions=torch.tensor([0]))
    torch.testing.assert_close(y, y0)


def test_alibi_slopes_and_bias():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert alibi_slopes(6).shape == (6,)
    b = alibi_bias(alibi_slopes(2), torch.arange(3), torch.arange(3))
    assert b.shape == (1, 2, 3, 3)
    torch.testing.assert_close(b[0, 0, 2], torch.tensor([-2 * 2**-4, -(2**-4), 0.0]))


def test_positions_count_real_tokens_only_and_restart_at_each_document():
    key_mask = torch.tensor([[False, False, True, True, True], [True, True, True, False, False]])
    # Left pads take the position of the first real token; right pads that of the next one.
    assert positions_from_mask(key_mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]
    # Decoding on: each row continues after its own count of real tokens.
    ones = torch.ones(2, 2, dtype=torch.bool)
    assert positions_from_mask(ones, torch.tensor([3, 5])).tolist() == [[3, 4], [5, 6]]
    segments = torch.tensor([[0, 0, 0, 1, 1, 2], [4, 4, 4, 4, 4, 4]])
    assert positions_from_segments(segments).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
