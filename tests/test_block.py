"""The block: GPT-2's (LayerNorm, GELU, a key/value head per query head) or the Llama-style one
(RMSNorm, SwiGLU or squared ReLU, grouped-query attention, QK-norm), each by a config key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lm.cli import main
from lm.config.sections import ModelConfig
from lm.model.rmsnorm import RMSNorm
from lm.model.transformer import MLP, LayerNorm, SwiGLU, TransformerLM

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("model.n_kv_head=3", "model.n_kv_head: n_head=4 is not a multiple of n_kv_head=3"),
        ("model.n_kv_head=0", "model.n_kv_head: must be from 1 to n_head=4"),
        ("model.n_kv_head=8", "model.n_kv_head: must be from 1 to n_head=4 (key/value heads"),
        ("model.norm=batchnorm", "model.norm: 'batchnorm' is not one of layernorm, rmsnorm"),
        ("model.mlp=geglu", "model.mlp: 'geglu' is not one of gelu, swiglu, relu2, none"),
        ("model.qk_norm=sometimes", "model.qk_norm: expected true or false, got 'sometimes'"),
        ("model.smear_keys=1.5", "model.smear_keys: expected true or false, got 1.5"),
    ],
)
def test_bad_block_settings_are_one_line_and_exit_2(setting, message, tmp_path, capsys):
    config = ROOT / "configs" / "llama.yaml"
    argv = ["train", str(config), "--set", setting, "--out", str(tmp_path / "run"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("lm: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not (tmp_path / "run").exists()


def test_rmsnorm_divides_by_the_root_mean_square_and_subtracts_no_mean():
    torch.manual_seed(0)
    norm = RMSNorm(6, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(6))
    x = torch.randn(3, 6) + 4.0  # far from zero mean: LayerNorm would remove the 4
    by_hand = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x), (by_hand * norm.weight.double()).float())
    assert not torch.allclose(norm(x), norm(x - 4.0), atol=1e-3)
    # bf16 in, bf16 out (the root mean square taken in float32).
    assert norm(x.bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize(("d_model", "width"), [(128, 344), (96, 256), (32, 88), (768, 2048)])
def test_swiglu_width_is_two_thirds_of_4d_rounded_up_to_8(d_model, width):
    cfg = ModelConfig(d_model=d_model, n_head=4, mlp="swiglu")
    assert cfg.ff_dim == width and width % 8 == 0 and width >= 8 * d_model / 3
    gelu = 2 * d_model * 4 * d_model
    assert abs(3 * d_model * width - gelu) / gelu < 0.04  # about the GELU MLP's parameters
    assert ModelConfig(d_model=d_model, n_head=4, mlp="swiglu", d_ff=40).ff_dim == 40
    assert ModelConfig(d_model=d_model, n_head=4, mlp="relu2").ff_dim == 4 * d_model


def test_swiglu_and_squared_relu_compute_their_formulas():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    cfg = ModelConfig(d_model=16, n_head=2, mlp="swiglu", bias=True)
    swiglu = SwiGLU(cfg)
    w1, w3, w2 = swiglu.gate, swiglu.up, swiglu.down
    torch.testing.assert_close(swiglu(x), w2(F.silu(w1(x)) * w3(x)))
    relu2 = MLP(ModelConfig(d_model=16, n_head=2, mlp="relu2"))
    torch.testing.assert_close(relu2(x), relu2.down(torch.relu(relu2.up(x)) ** 2))
    gelu = MLP(ModelConfig(d_model=16, n_head=2))
    torch.testing.assert_close(gelu(x), gelu.down(F.gelu(gelu.up(x))))


def test_the_block_keys_build_the_layers_they_name():
    llama = TransformerLM(ModelConfig(vocab_size=11, norm="rmsnorm", mlp="swiglu"))
    gpt2 = TransformerLM(ModelConfig(vocab_size=11))
    for model, norm, mlp in ((llama, RMSNorm, SwiGLU), (gpt2, LayerNorm, MLP)):
        block = model.blocks[0]
        assert type(block.norm1) is norm and type(block.norm2) is norm
        assert type(model.norm) is norm and type(block.mlp) is mlp
    # RMSNorm has no bias, whatever model.bias says of the linear layers.
    biased = TransformerLM(ModelConfig(vocab_size=11, norm="rmsnorm", bias=True))
    assert "norm.bias" not in biased.state_dict() and "blocks.0.mlp.up.bias" in biased.state_dict()


def test_a_run_saved_before_the_block_keys_is_the_gpt2_block():
    from lm.runs.load import load_run

    run = load_run(ROOT / "tests" / "golden" / "runs_before_plan" / "rope")
    m = run.config.model
    assert (m.norm, m.mlp, m.n_kv_head, m.qk_norm) == ("layernorm", "gelu", None, False)
    assert m.kv_heads == m.n_head
    assert type(run.model.blocks[0].norm1) is LayerNorm and type(run.model.blocks[0].mlp) is MLP


def _tiny(**model) -> TransformerLM:
    torch.manual_seed(0)
    cfg = dict(vocab_size=29, context_length=16, n_layer=2, n_head=4, d_model=32)
    model = TransformerLM(ModelConfig(**{**cfg, **model})).eval()
    with torch.no_grad():  # gains away from one, so that a misplaced gain shows
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
                p.add_(torch.randn_like(p) * 0.5)
    return model


def _repeated_heads(gqa: TransformerLM) -> TransformerLM:
    """The same model with one key/value head per query head: each of ``gqa``'s key and value
    heads repeated for the query heads of its group."""
    cfg = gqa.config
    H, kv, dk = cfg.n_head, cfg.kv_heads, cfg.head_dim
    mha = TransformerLM(dataclasses.replace(cfg, n_kv_head=None)).eval()
    state = dict(gqa.state_dict())
    for name in [n for n in state if n.endswith(("attn.qkv.weight", "attn.qkv.bias"))]:
        q, k, v = state[name].split([H * dk, kv * dk, kv * dk])
        group = lambda t: t.unflatten(0, (kv, dk)).repeat_interleave(H // kv, 0).flatten(0, 1)  # noqa: E731
        state[name] = torch.cat([q, group(k), group(v)])
    for name in [n for n in state if n.endswith("position.coefficients")]:  # FoPE's, per kv head
        state[name] = state[name].repeat_interleave(H // kv, 0)
    mha.load_state_dict(state)
    return mha


@pytest.mark.parametrize(
    ("model", "kernel"),
    [
        ({"position": "rope"}, "sdpa"),
        ({"position": "rope", "qk_norm": True, "bias": True}, "math"),
        ({"position": "alibi", "window": 5}, "sdpa"),
        ({"position": "cope"}, "sdpa"),  # CoPE's gates read the keys
        ({"position": ["fox", "xpos"]}, "math"),
        ({"position": "t5", "normalize": "ssmax"}, "sdpa"),
        ({"position": "none", "normalize": "stick_breaking"}, "sdpa"),
        ({"position": "pope"}, "sdpa"),  # its offsets per query head, the keys shared
        ({"position": "fope"}, "sdpa"),  # a series per key head, shared by its group
        ({"position": ["hope", "dape"]}, "math"),  # DAPE's MLP reads each query head's scores
        ({"position": "path"}, "sdpa"),  # a query head's own transforms of its group's keys
    ],
    ids=str,
)
@pytest.mark.parametrize("n_kv_head", [2, 1])
def test_a_query_head_reads_its_groups_keys_and_values(model, kernel, n_kv_head):
    gqa = _tiny(**model, kernel=kernel, n_kv_head=n_kv_head, norm="rmsnorm", mlp="swiglu")
    mha = _repeated_heads(gqa)
    ids = torch.randint(1, 29, (2, 11))
    key_mask = torch.ones_like(ids, dtype=torch.bool)
    key_mask[1, :3] = False  # left padding
    with torch.no_grad():
        torch.testing.assert_close(gqa(ids), mha(ids), atol=2e-5, rtol=1e-4)
        real = key_mask
        ours, theirs = gqa(ids, key_mask=key_mask), mha(ids, key_mask=key_mask)
        torch.testing.assert_close(ours[real], theirs[real], atol=2e-5, rtol=1e-4)
    qkv = gqa.blocks[0].attn.qkv.weight
    assert qkv.shape == ((4 + 2 * n_kv_head) * 8, 32)


def test_the_kv_cache_bytes_fall_by_n_head_over_n_kv_head():
    sizes = {}
    for kv in (4, 2, 1):
        model = _tiny(n_kv_head=kv, norm="rmsnorm", mlp="swiglu")
        cache = model.new_cache(3, 16)
        with torch.no_grad():
            model(torch.randint(1, 29, (3, 4)), cache=cache)  # every layer's keys made
        assert cache.v.shape == (2, 3, kv, 16, 8) and cache.k[1].shape == (3, kv, 16, 8)
        sizes[kv] = cache.nbytes
    assert sizes[4] == 2 * 2 * 3 * 4 * 16 * 8 * 4  # keys and values, layers, batch, heads, ...
    assert sizes[4] == 2 * sizes[2] == 4 * sizes[1]


def test_qk_norm_makes_scores_blind_to_the_scale_of_queries_and_keys():
    ids = torch.randint(1, 29, (2, 9))
    for qk_norm in (True, False):
        model = _tiny(qk_norm=qk_norm, norm="rmsnorm", mlp="swiglu", n_kv_head=2)
        with torch.no_grad():
            before = model(ids)
            for block in model.blocks:  # queries x 7, keys x 3 (values untouched)
                block.attn.qkv.weight[: 4 * 8] *= 7.0
                block.attn.qkv.weight[4 * 8 : 6 * 8] *= 3.0
            after = model(ids)
        if qk_norm:
            torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
        else:
            assert not torch.allclose(after, before, atol=1e-2)
    assert {"blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.weight"} <= set(
        _tiny(qk_norm=True).state_dict()
    )
    assert not any("q_norm" in name for name in _tiny().state_dict())


@pytest.mark.parametrize("position", ["rope", "xpos"])
def test_qk_norm_normalizes_before_the_rotation(position, monkeypatch):
    import lm.model.attention
    from lm.model.masks import positions

    model = _tiny(position=position, qk_norm=True, norm="rmsnorm", mlp="swiglu", n_kv_head=2)
    attn = model.blocks[0].attn
    with torch.no_grad():  # gains of many sizes: a rotation does not commute with them
        attn.q_norm.weight.copy_(torch.linspace(0.2, 3.0, 8))
        attn.k_norm.weight.copy_(torch.linspace(2.0, 0.5, 8))
    seen = []
    attend = lm.model.attention.attend
    monkeypatch.setattr(
        lm.model.attention,
        "attend",
        lambda q, k, *a, **kw: seen.append((q, k)) or attend(q, k, *a, **kw),
    )
    ids = torch.randint(1, 29, (1, 9))
    with torch.no_grad():
        model(ids)
        where = positions(model.config, ids)
        x = model.blocks[0].norm1(model.embed(ids))
        q, k, _ = attn.project(x)
        first = attn.position.rotate(attn.q_norm(q), attn.k_norm(k), where)
        after = attn.position.rotate(q, k, where)
        after = attn.q_norm(after[0]), attn.k_norm(after[1])
    for ours, wanted, wrong in zip(seen[0], first, after, strict=True):
        torch.testing.assert_close(ours, wanted)
        assert not torch.allclose(ours, wrong, atol=1e-3)
