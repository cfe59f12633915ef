"""The notes' claims about attention, each as a test."""

import math

import pytest
import torch

from lm.attention import MultiHeadAttention, attention, causal_mask
from lm.position import Rope


@pytest.fixture(autouse=True)
def _float64():
    """The notes' examples in float64; the default is restored for every other test module."""
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def test_soft_lookup_example_from_the_notes():
    # Query [1] at "the"; keys please=[0], send=[log 2], the=[log 3]; d_k = 1.
    q = torch.tensor([[1.0]])
    k = torch.tensor([[0.0], [math.log(2)], [math.log(3)]])
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0], [2.0, 2.0]])
    y, w = attention(q, k, v)
    torch.testing.assert_close(w, torch.tensor([[1 / 6, 2 / 6, 3 / 6]]))
    torch.testing.assert_close(y, torch.tensor([[7 / 6, 5 / 3]]))


def test_scaling_by_sqrt_dk_example():
    # Two keys whose raw dot products with q are 0 and sqrt(20), d_k = 20.
    d = 20
    q = torch.zeros(1, d)
    q[0, 0] = math.sqrt(d)
    k = torch.zeros(2, d)
    k[1, 0] = 1.0
    unscaled = torch.softmax(q @ k.T, dim=-1)
    assert unscaled[0, 0].item() == pytest.approx(0.011, abs=5e-4)
    assert unscaled[0, 1].item() == pytest.approx(0.989, abs=5e-4)
    _, w = attention(q, k, torch.eye(2))
    assert w[0, 0].item() == pytest.approx(0.269, abs=5e-4)
    assert w[0, 1].item() == pytest.approx(0.731, abs=5e-4)


def test_max_subtraction_keeps_weights_and_survives_huge_scores():
    q = torch.randn(3, 4)
    k = torch.randn(5, 4)
    v = torch.randn(5, 2)
    _, w = attention(q, k, v)
    s = q @ k.T / 2.0
    torch.testing.assert_close(w, torch.exp(s) / torch.exp(s).sum(-1, keepdim=True))
    big = torch.tensor([[1e4, 1e4 - 1.0, -1e4]])
    y, w = attention(torch.ones(1, 1), big.T, torch.eye(3))  # scores 1e4, 1e4-1, -1e4
    assert torch.isfinite(w).all() and torch.isfinite(y).all()
    torch.testing.assert_close(w[0, :2], torch.softmax(torch.tensor([1.0, 0.0]), -1))


def test_causal_mask_shape_and_values():
    m = causal_mask(5)
    assert m.shape == (5, 5)
    assert (m.tril() == 0).all()
    assert torch.isinf(m.triu(1)[torch.ones(5, 5, dtype=torch.bool).triu(1)]).all()
    assert (m.triu(1)[torch.ones(5, 5, dtype=torch.bool).triu(1)] < 0).all()


def _sa(x, causal=False, **kw):
    torch.manual_seed(0)
    mha = MultiHeadAttention(x.shape[-1], 2, **kw)
    return mha, mha(x, causal=causal)[0]


def test_self_attention_without_positions_is_permutation_equivariant():
    x = torch.randn(1, 6, 8)
    mha, y = _sa(x)
    for seed in range(5):
        perm = torch.randperm(6, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(mha(x[:, perm])[0], y[:, perm])


def test_causal_mask_makes_output_independent_of_the_future_and_breaks_equivariance():
    x = torch.randn(1, 6, 8)
    mha, y = _sa(x, causal=True)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 8)
    y2 = mha(x2, causal=True)[0]
    torch.testing.assert_close(y2[:, :4], y[:, :4])
    assert not torch.allclose(y2[:, 4:], y[:, 4:])
    perm = torch.tensor([5, 0, 3, 1, 4, 2])
    assert not torch.allclose(mha(x[:, perm], causal=True)[0], y[:, perm])


@pytest.mark.parametrize("kernel", ["sdpa", "math"])
def test_cross_attention_shapes_and_self_attention_as_special_case(kernel):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, kernel=kernel)
    x, c = torch.randn(2, 3, 8), torch.randn(2, 7, 8)
    y, w = mha(x, context=c, need_weights=True)
    assert y.shape == (2, 3, 8)
    assert w.shape == (2, 2, 3, 7)  # L_q x L_c weights per head
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 3))
    torch.testing.assert_close(mha(x, context=x)[0], mha(x)[0])
    q = torch.randn(4, 3)
    kk, vv = torch.randn(7, 3), torch.randn(7, 5)
    y1, w1 = attention(q, kk, vv)
    assert w1.shape == (4, 7) and y1.shape == (4, 5)  # L_q x d_v output


def _masks(B, L):
    key_mask = torch.ones(B, L, dtype=torch.bool)
    key_mask[0, :3] = False  # left padding: the first query rows see no real key
    key_mask[1, -2:] = False  # right padding
    return key_mask


@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_and_explicit_paths_agree_with_and_without_masks(position, causal):
    torch.manual_seed(1)
    fused = MultiHeadAttention(16, 4, position=position, kernel="sdpa")
    explicit = MultiHeadAttention(16, 4, position=position, kernel="math")
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(2, 7, 16)
    for key_mask in (None, _masks(2, 7)):
        a, _ = fused(x, key_mask=key_mask, causal=causal)
        b, _ = explicit(x, key_mask=key_mask, causal=causal)
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "rope",
    [Rope(4, method="yarn", factor=4.0, context=4), Rope(4, pairs=1, method="pi", factor=2.0)],
    ids=["yarn", "partial-pi"],
)
def test_fused_and_explicit_paths_agree_under_a_rope_extension(rope):
    torch.manual_seed(1)
    fused = MultiHeadAttention(16, 4, position="rope", rope=rope, kernel="sdpa")
    explicit = MultiHeadAttention(16, 4, position="rope", rope=rope, kernel="math")
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(2, 7, 16)
    for key_mask in (None, _masks(2, 7)):
        a, _ = fused(x, key_mask=key_mask, causal=True)
        b, _ = explicit(x, key_mask=key_mask, causal=True)
        torch.testing.assert_close(a, b)


def test_padded_keys_get_zero_weight_and_empty_rows_stay_finite():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 5, 8)
    key_mask = _masks(2, 5)
    y, w = mha(x, key_mask=key_mask, causal=True, need_weights=True)
    assert (w[0, :, :, :3] == 0).all() and (w[1, :, :, -2:] == 0).all()
    assert torch.isfinite(y).all()
    # Rows 0-2 of sequence 0 have no real key at all (left padding + causal): zero, not NaN.
    assert (w[0, :, :3] == 0).all()
    every_key_padded = torch.zeros(2, 5, dtype=torch.bool)
    for kernel in ("sdpa", "math"):
        mha.kernel = kernel
        out, _ = mha(x, key_mask=every_key_padded)
        assert torch.isfinite(out).all()
    # Boolean and additive masks mean the same thing in the explicit function.
    q, k, v = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 2)
    torch.testing.assert_close(
        attention(q, k, v, causal_mask(3))[0],
        attention(q, k, v, torch.ones(3, 3, dtype=torch.bool).tril())[0],
    )


def test_padded_keys_do_not_change_real_outputs():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 4, 8)
    ref = mha(x, causal=True)[0]
    padded = torch.cat([x, torch.randn(1, 3, 8)], dim=1)
    key_mask = torch.tensor([[True] * 4 + [False] * 3])
    out = mha(padded, key_mask=key_mask, causal=True)[0]
    torch.testing.assert_close(out[:, :4], ref)


def _documents_and_padding(B: int, L: int) -> dict:
    """Two documents per row and left padding in row 0: each kind of mask flex must express."""
    segments = torch.zeros(B, L, dtype=torch.long)
    segments[:, L // 2 :] = 1
    key_mask = torch.ones(B, L, dtype=torch.bool)
    key_mask[0, :3] = False  # rows 0-2 of sequence 0 read no real key
    return {"segments": segments, "key_mask": key_mask}


@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
def test_flex_equals_the_explicit_formula_under_documents_padding_and_alibi(position):
    # FlexAttention gets masks and the ALiBi bias as functions of (batch, head, query, key), not
    # as tensors; no grad: on CPU PyTorch's flex runs forward only.
    torch.manual_seed(2)
    flex = MultiHeadAttention(32, 2, position=position, kernel="flex").float().eval()
    explicit = MultiHeadAttention(32, 2, position=position, kernel="math").float().eval()
    explicit.load_state_dict(flex.state_dict())
    x = torch.randn(2, 9, 32, dtype=torch.float32)
    with torch.no_grad():
        for masks in ({}, _documents_and_padding(2, 9)):
            a = flex(x, causal=True, **masks)[0]
            b = explicit(x, causal=True, **masks)[0]
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (a[0, :3] == 0).all()  # queries with no real key: a zero output (no bias), not NaN


def test_flex_trains_on_cpu_through_sdpa_masks_and_equals_them():
    # PyTorch has no FlexAttention backward on CPU: with gradients on, the flex kernel falls back
    # to SDPA's masks, so a training step runs and matches the sdpa kernel exactly.
    torch.manual_seed(3)
    flex = MultiHeadAttention(32, 2, position="alibi", kernel="flex").float()
    sdpa = MultiHeadAttention(32, 2, position="alibi", kernel="sdpa").float()
    sdpa.load_state_dict(flex.state_dict())
    x = torch.randn(2, 9, 32, dtype=torch.float32)
    masks = _documents_and_padding(2, 9)
    a, b = flex(x, causal=True, **masks)[0], sdpa(x, causal=True, **masks)[0]
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    a.sum().backward()
    assert flex.qkv.weight.grad is not None


def test_segments_are_refused_with_a_cache_or_a_context():
    mha = MultiHeadAttention(8, 2)
    x, segments = torch.randn(1, 4, 8), torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="segments are for self-attention"):
        mha(x, context=torch.randn(1, 3, 8), segments=segments)
