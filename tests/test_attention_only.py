"""Attention-only blocks (``model.mlp: none``) and smeared keys (``model.smear_keys``), the
models of Olsson et al. 2022's induction-head experiments: their formulas, and every guarantee
of the model (causality, padding, packed documents, the KV cache, exact resume) with them on,
over position schemes of each place."""

from __future__ import annotations

import pytest
import torch
from _support import (
    BLOCKS,
    assert_padding_is_invisible,
    assert_same_weights,
    losses,
    nan_loss_at_step,
    tiny_config,
)

from lm.config.errors import ConfigError
from lm.config.sections import ModelConfig
from lm.model.masks import masks, positions, previous_tokens
from lm.model.transformer import TransformerLM
from lm.runs.checkpoint import latest_checkpoint
from lm.runs.load import load_run
from lm.training.loop import train

# Rotation, score bias, the embeddings, nothing, and two content schemes (FoX reads x, CoPE the
# keys themselves).
SCHEMES = ["rope", "alibi", "learned", "none", "fox", "cope"]
SETTINGS = {"attention-only": {"mlp": "none"}, "smeared": {"smear_keys": True}}
SETTINGS["both"] = {**SETTINGS["attention-only"], **SETTINGS["smeared"]}


def model_with(position="rope", block=None, **settings) -> TransformerLM:
    """A tiny model, each smearing gate at its own value (not the even mix it starts at)."""
    torch.manual_seed(5)
    shape = dict(vocab_size=30, context_length=12, n_layer=2, n_head=2, d_model=16)
    config = ModelConfig(**{**shape, "position": position, **(block or {}), **settings})
    model = TransformerLM(config).eval()
    with torch.no_grad():
        model.embed.weight.mul_(20)  # sharper logits than the 0.02-std init
        for block in model.blocks:
            if block.attn.smear is not None:
                block.attn.smear.gate.copy_(torch.randn(config.kv_heads))
    return model


def test_attention_only_blocks_have_no_mlp_and_no_second_norm(block):
    full, bare = model_with(block=block), model_with(block=block, mlp="none")
    for layer in bare.blocks:
        assert layer.mlp is None and layer.norm2 is None
    mlp_and_norm = sum(
        p.numel() for b in full.blocks for m in (b.mlp, b.norm2) for p in m.parameters()
    )
    assert bare.num_parameters() == full.num_parameters() - mlp_and_norm
    # The residual stream is the embeddings plus each layer's attention output, then the final
    # norm and the head.
    ids = torch.randint(0, 30, (2, 9))
    with torch.no_grad():
        where = positions(bare.config, ids)
        M = masks(bare.config, where)[None]
        x = bare.embed(ids)
        for layer in bare.blocks:
            x = x + layer.attn(layer.norm1(x), where, M)
        torch.testing.assert_close(bare(ids), bare.head(bare.norm(x)))


def test_attention_only_output_projections_are_scaled_by_their_one_branch_a_block():
    model = TransformerLM(
        ModelConfig(vocab_size=30, n_layer=8, d_model=64, n_head=4, mlp="none", d_ff=None)
    )
    std = torch.cat([b.attn.out.weight.flatten() for b in model.blocks]).std().item()
    assert abs(std - 0.02 / 8**0.5) < 0.1 * 0.02 / 8**0.5


def test_an_mlp_width_without_an_mlp_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"model\.d_ff: 64 sets the width of an MLP"):
        ModelConfig(vocab_size=30, mlp="none", d_ff=64)


def test_each_key_is_mixed_with_its_documents_previous_real_key_by_its_heads_gate():
    model = model_with("none", smear_keys=True, n_head=4)  # no rotation: the keys as mixed
    attn = model.blocks[0].attn
    x = torch.randn(2, 7, 16)
    key_mask = torch.tensor([[False, False, True, True, False, True, True], [True] * 7])
    where = positions(model.config, x[..., 0], key_mask)
    _, k, _ = attn.project(x)  # (B, H, T, d_k)
    g = torch.sigmoid(attn.smear.gate).view(1, -1, 1, 1)
    # Row 0: the first real token keeps its own key, then each reads the last real one before
    # it, past the pad at 4; row 1: the one before, and token 0 its own.
    previous = torch.tensor([[0, 1, 2, 2, 3, 3, 5], [0, 0, 1, 2, 3, 4, 5]])
    assert where.previous.tolist() == previous.tolist()
    before = torch.stack([k[b][:, previous[b]] for b in range(2)])
    want = g * k + (1 - g) * before
    torch.testing.assert_close(attn.smear(k, where.previous), want)
    assert torch.equal(attn.smear(k, where.previous)[:, :, 0], k[:, :, 0])  # exactly its own
    # Packed documents: none smears across a boundary.
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, 2]])
    where = positions(model.config, x[:1, :, 0], segments=segments)
    assert where.previous.tolist() == [[0, 0, 1, 3, 3, 5, 5]]


def test_previous_tokens_point_into_the_cache_where_a_pass_starts_mid_row():
    counted = torch.tensor([[0, 0, 1], [3, 4, 5]])  # row 0: its first real token in this pass
    key_mask = torch.tensor([[False, True, True], [True, True, True]])
    assert previous_tokens(counted, key_mask).tolist() == [[0, 1, 1], [-1, 0, 1]]


@pytest.mark.parametrize("position", ["rope", "pope"])
def test_keys_are_smeared_before_rotation_each_rotated_by_its_own_position(position, monkeypatch):
    model = model_with(position, smear_keys=True)
    attn, seen = model.blocks[0].attn, {}
    rotate = attn.position.rotate

    def spy(q, k, where):
        seen["k"] = k
        return rotate(q, k, where)

    monkeypatch.setattr(attn.position, "rotate", spy)
    ids = torch.randint(0, 30, (1, 8))
    with torch.no_grad():
        model(ids)
        x = model.blocks[0].norm1(model.embed(ids))  # no table and no scale to add
        _, k, _ = attn.project(x)
        where = positions(model.config, ids)
        torch.testing.assert_close(seen["k"], attn.smear(k, where.previous))


@pytest.mark.parametrize("setting", SETTINGS.values(), ids=SETTINGS.keys())
@pytest.mark.parametrize("position", SCHEMES)
def test_causal_padded_and_packed_documents_with_either_setting(position, setting, block):
    model = model_with(position, block, **setting)
    x = torch.randint(1, 30, (2, 11))
    y = x.clone()
    y[:, 6:] = torch.randint(1, 30, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :6], model(y)[:, :6])
    assert_padding_is_invisible(model, [torch.randint(1, 30, (n,)) for n in (9, 4, 6)], T=11)
    a, b = torch.randint(1, 30, (5,)), torch.randint(1, 30, (6,))
    segments = torch.tensor([[0] * 5 + [1] * 6])
    with torch.no_grad():
        packed = model(torch.cat([a, b])[None], segment_ids=segments)[0]
        torch.testing.assert_close(packed[:5], model(a[None])[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(packed[5:], model(b[None])[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kernel", ["sdpa", "math"])
@pytest.mark.parametrize("setting", SETTINGS.values(), ids=SETTINGS.keys())
@pytest.mark.parametrize("position", SCHEMES)
def test_kv_cache_decoding_equals_the_full_forward(position, setting, kernel, block):
    # Row 0 padded on the left (its first real token at slot 3); the prompt, then one token a
    # pass: each pass sees only its new tokens, the cache keeps the last key to smear with.
    model = model_with(position, block, kernel=kernel, **setting)
    ids = torch.randint(1, 30, (2, 10))
    real = torch.ones(2, 10, dtype=torch.bool)
    real[0, :3] = False
    with torch.no_grad():
        full = model(ids, key_mask=real)
        cache = model.new_cache(2, 12)
        steps = [model(ids[:, :4], key_mask=real[:, :4], cache=cache)]
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(4, 8)]
        steps += [model(ids[:, 8:], cache=cache)]  # two at once
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], atol=1e-5, rtol=1e-4)
    if setting.get("smear_keys"):  # one key per row and head a layer, not every slot's
        assert all(kept.shape[2] == 1 for kept in cache._last.values())


@pytest.mark.parametrize(
    ("optimizer", "model"),
    [
        ("adamw", {"position": "rope", **SETTINGS["both"]}),
        ("muon", {**BLOCKS["llama"], "position": ["alibi", "cope"], **SETTINGS["both"]}),
    ],
    ids=["gpt2-rope-adamw", "llama-alibi-cope-muon"],
)
def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, optimizer, model):
    cfg = tiny_config(
        model=model,
        train={"max_steps": 16, "checkpoint_every": 8, "eval_every": 8, "optimizer": optimizer},
    )
    train(cfg, tmp_path / "straight", quiet=True)
    with nan_loss_at_step(11):  # crash between checkpoints 8 and 16, then resume from 8
        crashed = train(cfg, tmp_path / "resumed", quiet=True)
    assert crashed.status == "nonfinite" and latest_checkpoint(tmp_path / "resumed").name.endswith(
        "8"
    )
    assert train(cfg, tmp_path / "resumed", resume=True, quiet=True).status == "done"
    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")
    assert_same_weights(tmp_path / "resumed", tmp_path / "straight")
    gates = [b.attn.smear.gate for b in load_run(tmp_path / "resumed").model.blocks]
    assert all((gate != 0).all() for gate in gates)  # learned from 0, and kept by checkpoints


@pytest.mark.parametrize("position", ["rope", "cope"])
def test_generation_with_and_without_the_cache_gives_each_prompt_its_own_tokens(position):
    from lm.sample import generate

    model = model_with(position, **SETTINGS["both"])
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]  # last > context
    alone = [generate(model, [p], 20, pad_id=0, use_cache=False)[0] for p in prompts]
    for use_cache in (True, False):
        assert generate(model, prompts, 20, pad_id=0, use_cache=use_cache) == alone
