"""The notes' claims about attention, each as a test."""

import math

import pytest
import torch
from _support import attention_layer, fused_calls, self_attend

from lm.model.kernels import attention, softmax_rows
from lm.model.masks import causal_mask


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
    # On lm's own kernel: the notes' softmax of the raw scores, and the written-out attention
    # with its 1/sqrt(d_k) undone by scaling q up.
    unscaled = softmax_rows(q @ k.T)
    torch.testing.assert_close(attention(q * math.sqrt(d), k, torch.eye(2))[1], unscaled)
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


def test_the_causal_mask_is_the_one_every_kernel_uses_and_shifts_for_a_cache():
    # Three queries at slots 2-4 of five (two cached before them): query i reads slots <= 2 + i.
    m = causal_mask(3, keys=5, first=2)
    assert (m == 0).tolist() == [[True] * 3 + [False] * 2, [True] * 4 + [False], [True] * 5]
    assert torch.equal(causal_mask(4, keys=4, first=0), causal_mask(4))


def _sa(x, causal=False, **kw):
    torch.manual_seed(0)
    mha, cfg = attention_layer(x.shape[-1], 2, **kw)
    return mha, cfg, self_attend(mha, cfg, x, causal=causal)


def test_self_attention_without_positions_is_permutation_equivariant():
    x = torch.randn(1, 6, 8)
    mha, cfg, y = _sa(x, position="none")
    for seed in range(5):
        perm = torch.randperm(6, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(self_attend(mha, cfg, x[:, perm], causal=False), y[:, perm])


def test_causal_mask_makes_output_independent_of_the_future_and_breaks_equivariance():
    x = torch.randn(1, 6, 8)
    mha, cfg, y = _sa(x, causal=True, position="none")
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 8)
    y2 = self_attend(mha, cfg, x2)
    torch.testing.assert_close(y2[:, :4], y[:, :4])
    assert not torch.allclose(y2[:, 4:], y[:, 4:])
    perm = torch.tensor([5, 0, 3, 1, 4, 2])
    assert not torch.allclose(self_attend(mha, cfg, x[:, perm]), y[:, perm])


def test_cross_attention_shapes_and_self_attention_as_special_case():
    # CA(X, C): queries from X, keys and values from C, with the layer's own W_Q, W_K, W_V, W_O.
    torch.manual_seed(0)
    mha, cfg = attention_layer(8, 2, position="none")
    x, c = torch.randn(2, 3, 8), torch.randn(2, 7, 8)

    def cross(x, c):
        q, k, v = mha.project(x)[0], *mha.project(c)[1:]  # (B, H, L, d_k)
        y, w = attention(q, k, v)
        return mha.out(y.transpose(1, 2).flatten(2)), w

    y, w = cross(x, c)
    assert y.shape == (2, 3, 8)
    assert w.shape == (2, 2, 3, 7)  # L_q x L_c weights per head
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 3))
    for kernel in ("sdpa", "math"):
        unmasked = self_attend(mha, cfg, x, causal=False, kernel=kernel)
        torch.testing.assert_close(cross(x, x)[0], unmasked)
    q = torch.randn(4, 3)
    kk, vv = torch.randn(7, 3), torch.randn(7, 5)
    y1, w1 = attention(q, kk, vv)
    assert w1.shape == (4, 7) and y1.shape == (4, 5)  # L_q x d_v output


def _masks(B, L):
    key_mask = torch.ones(B, L, dtype=torch.bool)
    key_mask[0, :3] = False  # left padding: the first query rows see no real key
    key_mask[1, -2:] = False  # right padding
    return key_mask


@pytest.mark.parametrize("position", ["none", "rope", "alibi", "t5", "kerple", "fire"])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_and_explicit_paths_agree_with_and_without_masks(position, causal):
    # Without gradients: with them on a CPU, a learned bias (T5, KERPLE, FIRE) takes the notes'
    # formula whatever the kernel asked, and both sides would run the same code. Each side's
    # kernel is checked: the fused one calls PyTorch's SDPA, the explicit one never does.
    torch.manual_seed(1)
    fused, cfg = attention_layer(16, 4, position=position, kernel="sdpa")
    explicit, explicit_cfg = attention_layer(16, 4, position=position, kernel="math")
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(2, 7, 16)
    for key_mask in (None, _masks(2, 7)):
        with torch.no_grad(), fused_calls() as calls:
            a = self_attend(fused, cfg, x, key_mask=key_mask, causal=causal)
            assert len(calls) == 1, "the fused side did not run SDPA"
            b = self_attend(explicit, explicit_cfg, x, key_mask=key_mask, causal=causal)
            assert len(calls) == 1, "the explicit side ran SDPA"
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_scaling": "yarn:4", "rope_original_context": 4},
        {"rope_fraction": 0.5, "rope_scaling": "pi:2"},
    ],
    ids=["yarn", "partial-pi"],
)
def test_fused_and_explicit_paths_agree_under_a_rope_extension(rope):
    torch.manual_seed(1)
    fused, cfg = attention_layer(16, 4, position="rope", kernel="sdpa", **rope)
    explicit, explicit_cfg = attention_layer(16, 4, position="rope", kernel="math", **rope)
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(2, 7, 16)
    for key_mask in (None, _masks(2, 7)):
        a = self_attend(fused, cfg, x, key_mask=key_mask)
        b = self_attend(explicit, explicit_cfg, x, key_mask=key_mask)
        torch.testing.assert_close(a, b)


def test_padded_keys_get_zero_weight_and_empty_rows_stay_finite():
    from lm.model.masks import masks, positions

    torch.manual_seed(0)
    mha, cfg = attention_layer(8, 2, position="none", kernel="math")
    x = torch.randn(2, 5, 8)
    key_mask = _masks(2, 5)
    where = positions(cfg, torch.zeros(2, 5, dtype=torch.long), key_mask)
    _, (s, a) = mha(x, where, masks(cfg, where, key_mask)[None], weights=True)  # (S + M, A)
    w = softmax_rows(s)  # (B, H, T, T)
    torch.testing.assert_close(w, a)
    y = self_attend(mha, cfg, x, key_mask=key_mask)
    assert (w[0, :, :, :3] == 0).all() and (w[1, :, :, -2:] == 0).all()
    assert torch.isfinite(y).all()
    # Rows 0-2 of sequence 0 have no real key at all (left padding + causal): zero, not NaN.
    assert (w[0, :, :3] == 0).all()
    every_key_padded = torch.zeros(2, 5, dtype=torch.bool)
    for kernel in ("sdpa", "math"):
        out = self_attend(mha, cfg, x, key_mask=every_key_padded, causal=False, kernel=kernel)
        assert torch.isfinite(out).all()
    # Boolean and additive masks mean the same thing in the explicit function.
    q, k, v = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 2)
    torch.testing.assert_close(
        attention(q, k, v, causal_mask(3))[0],
        attention(q, k, v, torch.ones(3, 3, dtype=torch.bool).tril())[0],
    )


@pytest.mark.parametrize("kernel", ["sdpa", "math"])
def test_padded_keys_do_not_change_real_outputs(kernel):
    # Pads on the left are past keys, which causal attention would read without the key mask;
    # pads on the right are future keys, read only without causality.
    torch.manual_seed(0)
    mha, cfg = attention_layer(8, 2, position="none", kernel=kernel)
    x, pads = torch.randn(1, 4, 8), torch.randn(1, 3, 8)
    real = torch.tensor([[True] * 4])
    for causal in (True, False):
        ref = self_attend(mha, cfg, x, causal=causal)
        left = self_attend(
            mha, cfg, torch.cat([pads, x], 1), key_mask=torch.cat([~real[:, :3], real], 1),
            causal=causal,
        )  # fmt: skip
        torch.testing.assert_close(left[:, 3:], ref)
        right = self_attend(
            mha, cfg, torch.cat([x, pads], 1), key_mask=torch.cat([real, ~real[:, :3]], 1),
            causal=causal,
        )  # fmt: skip
        torch.testing.assert_close(right[:, :4], ref)


def _documents_and_padding(B: int, L: int) -> dict:
    """Two documents per row and left padding in row 0: each kind of mask flex must express."""
    segments = torch.zeros(B, L, dtype=torch.long)
    segments[:, L // 2 :] = 1
    key_mask = torch.ones(B, L, dtype=torch.bool)
    key_mask[0, :3] = False  # rows 0-2 of sequence 0 read no real key
    return {"segments": segments, "key_mask": key_mask}


# (position, model keys, compiled): each case through PyTorch's eager FlexAttention, which calls
# the same score and mask functions; ALiBi's also compiled, as a model runs it (seconds a case).
FLEX_CASES = [
    *[(p, {}, False) for p in ("none", "rope", "alibi", "t5", "kerple", "fire", "sandwich")],
    ("xpos", {}, False),
    ("fox", {}, False),
    ("rope", {"window": 4}, False),
    ("alibi", {"window": 3, "normalize": "ssmax"}, False),
    ("alibi", {}, True),
]


@pytest.mark.parametrize(("position", "options", "compiled"), FLEX_CASES, ids=str)
def test_flex_equals_the_explicit_formula_under_documents_padding_and_alibi(
    position, options, compiled, monkeypatch
):
    # FlexAttention gets masks, windows and a score bias (ALiBi's, T5's, FoX's) as functions of
    # (batch, head, query, key), not as tensors; no grad: on CPU PyTorch's flex runs forward only.
    if not compiled:
        import lm.model.kernels as kernels

        monkeypatch.setattr(kernels, "_compiled_flex", lambda: kernels.flex_attention)
    torch.manual_seed(2)
    flex, cfg = attention_layer(32, 2, position=position, kernel="flex", **options)
    explicit, explicit_cfg = attention_layer(32, 2, position=position, kernel="math", **options)
    flex, explicit = flex.float().eval(), explicit.float().eval()
    explicit.load_state_dict(flex.state_dict())
    x = torch.randn(2, 9, 32, dtype=torch.float32)
    with torch.no_grad():
        for masks in ({}, _documents_and_padding(2, 9)):
            a = self_attend(flex, cfg, x, **masks)
            b = self_attend(explicit, explicit_cfg, x, **masks)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (a[0, :3] == 0).all()  # queries with no real key: a zero output (no bias), not NaN


def test_flex_trains_on_cpu_through_sdpa_masks_and_equals_them():
    # PyTorch has no FlexAttention backward on CPU: with gradients on, the flex kernel falls back
    # to SDPA's masks, so a training step runs and matches the sdpa kernel exactly.
    torch.manual_seed(3)
    flex, cfg = attention_layer(32, 2, position="alibi", kernel="flex")
    sdpa, sdpa_cfg = attention_layer(32, 2, position="alibi", kernel="sdpa")
    flex, sdpa = flex.float(), sdpa.float()
    sdpa.load_state_dict(flex.state_dict())
    x = torch.randn(2, 9, 32, dtype=torch.float32)
    masks = _documents_and_padding(2, 9)
    a, b = self_attend(flex, cfg, x, **masks), self_attend(sdpa, sdpa_cfg, x, **masks)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    a.sum().backward()
    assert flex.qkv.weight.grad is not None


def test_attention_names_no_position_scheme_and_reads_like_the_notes():
    # A new scheme is a new part in lm.position: attention never branches on a scheme's name.
    import ast
    import inspect
    import re
    from pathlib import Path

    import lm.model.attention
    from lm.config.names import POSITIONS
    from lm.model.attention import MultiHeadAttention

    texts = []  # every string, name and attribute of the module: its code and docstrings
    for node in ast.walk(ast.parse(Path(lm.model.attention.__file__).read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
        texts += [getattr(node, "id", ""), getattr(node, "attr", "")]
    words = {w.lower() for text in texts for w in re.findall(r"[A-Za-z]+", text)}
    assert not words & {*POSITIONS, "alibi", "rotary", "sinusoids"}
    forward = inspect.signature(MultiHeadAttention.forward).parameters
    assert list(forward) == ["self", "x", "where", "mask", "cache", "weights"]
    assert len(inspect.getsource(MultiHeadAttention.forward).splitlines()) <= 40


def test_with_dropout_the_formula_computes_each_layers_output_once():
    # Y = dropout(A) V, and nothing else: the weights leave by being returned, not by a second
    # product of A and V.
    from torch.overrides import TorchFunctionMode

    class Products(TorchFunctionMode):
        count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Products.count += getattr(func, "__name__", "") in ("matmul", "__matmul__")
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    mha, cfg = attention_layer(8, 2, position="none", kernel="math", dropout=0.5)
    with Products():
        self_attend(mha.train(), cfg, torch.randn(2, 5, 8))
    assert Products.count == 2  # Q K^T and A V


def test_no_side_channel_between_layers_remains_in_lm():
    # Layers read the pass's positions and their window's mask: no parameter named `shared` (a
    # dict the first layer filled and later ones trusted), no `need_weights` threaded through.
    import ast
    from pathlib import Path

    import lm

    found = []
    paths = sorted(Path(lm.__file__).parent.rglob("*.py"))
    assert any(path.parent.name == "model" for path in paths)  # every subpackage is read
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.arg) and node.arg in {"shared", "need_weights"}:
                found.append(f"{path}:{node.lineno} {node.arg}")
    assert found == []
