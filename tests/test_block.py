"""The block: GPT-2's (LayerNorm, GELU, a key/value head per query head) or the Llama-style one
(RMSNorm, SwiGLU or squared ReLU, grouped-query attention, QK-norm), each by a config key."""

from __future__ import annotations

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
        ("model.mlp=geglu", "model.mlp: 'geglu' is not one of gelu, swiglu, relu2"),
        ("model.qk_norm=sometimes", "model.qk_norm: expected true or false, got 'sometimes'"),
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
