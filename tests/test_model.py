"""The decoder-only LM: causality, padding invariance, initialisation, parameter count."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from _support import assert_padding_is_invisible

from lm.config.names import POSITIONS
from lm.config.sections import ModelConfig
from lm.model.masks import masks, positions
from lm.model.schemes.base import PositionOutOfRange
from lm.model.transformer import TransformerLM

# Per-layer hybrids of the two layers of tiny(): NoPE above RoPE, and two schemes that each
# share one bias across their layers in the same model.
LAYERED = [["rope", "none"], ["t5", "alibi"]]
# The normalizations, p-RoPE and sliding windows beside the schemes: each composes with them.
OPTIONS = [
    ("rope", {"normalize": "ssmax"}),
    ("none", {"normalize": "stick_breaking"}),
    ("alibi", {"window": 4}),
    ("fox", {"window": [4, None]}),
    (["xpos", "cope"], {"rope_p": 0.5, "window": [None, 3]}),
]
EVERY = [(position, {}) for position in [*POSITIONS, *LAYERED]] + OPTIONS


def tiny(position="rope", **kw) -> TransformerLM:
    torch.manual_seed(0)
    cfg = dict(vocab_size=37, context_length=16, n_layer=2, n_head=2, d_model=16, position=position)
    cfg.update(kw)
    return TransformerLM(ModelConfig(**cfg)).eval()


@pytest.mark.parametrize(("position", "options"), EVERY, ids=str)
def test_changing_future_tokens_leaves_earlier_logits_unchanged(position, options, block):
    model = tiny(position, **options, **block)
    x = torch.randint(0, 37, (2, 12))
    y = x.clone()
    y[:, 7:] = torch.randint(0, 37, (2, 5))
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize(("position", "options"), EVERY, ids=str)
@pytest.mark.parametrize("kernel", ["sdpa", "math"])
def test_padded_batch_gives_each_real_token_its_unpadded_logits(position, options, kernel, block):
    model = tiny(position, kernel=kernel, **options, **block)
    seqs = [torch.randint(1, 37, (n,)) for n in (9, 4, 6)]
    assert_padding_is_invisible(model, seqs, T=11, pad=0)


@pytest.mark.parametrize(("position", "options"), EVERY, ids=str)
def test_right_padded_batches_drop_the_key_mask_and_keep_logits_and_loss(position, options, block):
    from lm.data.batches import PaddedCollator, model_inputs
    from lm.model.transformer import loss_sum

    model = tiny(position, **options, **block)
    seqs = [torch.randint(1, 37, (n,)).tolist() for n in (12, 5, 8)]
    right = PaddedCollator(pad_id=0, padding_side="right")(seqs)
    b = model_inputs(right, torch.device("cpu"))
    assert "key_mask" not in b["inputs"]  # the fused causal path: no mask tensor
    real = right["key_mask"]
    with torch.no_grad():
        fast = model(**b["inputs"])
        masked = model(right["input_ids"], key_mask=real)
    torch.testing.assert_close(fast[real], masked[real], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(
        loss_sum(fast, b["targets"], b["loss_mask"]),
        loss_sum(masked, right["targets"], right["loss_mask"]),
        atol=1e-5,
        rtol=1e-5,
    )
    # Left padding and document masks still need the key mask.
    left = PaddedCollator(pad_id=0, padding_side="left")(seqs)
    assert "key_mask" in model_inputs(left, torch.device("cpu"))["inputs"]
    right["segment_ids"] = torch.zeros_like(right["input_ids"])
    assert "key_mask" in model_inputs(right, torch.device("cpu"))["inputs"]


@pytest.mark.parametrize(("position", "options"), EVERY, ids=str)
def test_document_segments_equal_separate_documents(position, options, block):
    model = tiny(position, **options, **block)
    a, b = torch.randint(1, 37, (5,)), torch.randint(1, 37, (6,))
    ids = torch.cat([a, b])[None]
    segments = torch.tensor([[0] * 5 + [1] * 6])
    with torch.no_grad():
        packed = model(ids, segment_ids=segments)[0]
        torch.testing.assert_close(packed[:5], model(a[None])[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(packed[5:], model(b[None])[0], atol=2e-5, rtol=1e-4)


def test_each_layer_holds_its_own_schemes_part_and_reads_its_own_bias():
    from lm.model.schemes.base import NoPosition
    from lm.model.schemes.biases import T5, ALiBi
    from lm.model.schemes.rope import RoPE

    model = tiny(["rope", "none", "t5", "alibi", "t5"], n_layer=5)
    parts = [type(block.attn.position) for block in model.blocks]
    assert parts == [RoPE, NoPosition, T5, ALiBi, T5]
    assert [n for n, _ in model.named_parameters() if ".position." in n] == [
        "blocks.2.attn.position.table"  # the first t5 layer holds the one table
    ]
    assert model.one_bias_schemes == [model.blocks[2].attn.position, model.blocks[3].attn.position]
    seen = {}  # what each layer's scheme gives as its score bias B, in a forward pass
    for i in (2, 3, 4):
        attn = model.blocks[i].attn
        attn.register_forward_pre_hook(
            lambda m, a, i=i: seen.__setitem__(i, m.position.score_bias(*a[1:3]))
        )
    with torch.no_grad():
        model(torch.zeros(1, 6, dtype=torch.long), kernel="math")
    assert seen[2] is seen[4] and seen[2].shape == (1, 2, 6, 6)  # one bias of each scheme
    assert not torch.equal(seen[2], seen[3])
    assert model.blocks[0].attn.rotates and not model.blocks[0].attn.biases


def test_tied_head_gpt2_init_and_parameter_count():
    model = tiny("learned", n_layer=4)
    assert model.head.weight is model.embed.weight
    d, V, C, ff = 16, 37, 16, 64
    per_block = 2 * d + 3 * d * d + d * d + d * ff + ff * d  # two norms (no bias), attn, mlp
    assert model.num_parameters() == V * d + C * d + 4 * per_block + d
    assert model.num_parameters(non_embedding=True) == 4 * per_block + d
    std = model.blocks[0].mlp.down.weight.std().item()
    assert std == pytest.approx(0.02 / (2 * 4) ** 0.5, rel=0.2)
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.2)
    untied = tiny("rope", tie_embeddings=False)
    assert untied.head.weight is not untied.embed.weight


def test_learned_positions_refuse_lengths_beyond_the_table_but_sinusoids_extend():
    with torch.no_grad(), pytest.raises(PositionOutOfRange, match="learned positions"):
        tiny("learned")(torch.randint(0, 37, (1, 20)))
    for position in [p for p in POSITIONS if p != "learned"]:
        with torch.no_grad():
            assert torch.isfinite(tiny(position)(torch.randint(0, 37, (1, 40)))).all()


@pytest.mark.parametrize("scale", [True, False])
def test_sinusoidal_model_adds_the_notes_table_to_embeddings(scale):
    from lm.model.schemes.embeddings import sinusoidal_table

    model = tiny("sinusoidal", n_layer=1, scale_embeddings=scale)
    ids = torch.randint(0, 37, (2, 12))
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda block, args: seen.append(args[0]))
    with torch.no_grad():
        model(ids)
    # What the first block reads is E[w_l] + p_l, the notes' table at positions 0..11 (with
    # model.scale_embeddings, Vaswani et al.'s sqrt(d) E[w_l] + p_l).
    embedded = model.embed.weight[ids] * (4.0 if scale else 1.0)  # sqrt(16)
    expected = embedded + sinusoidal_table(16, 16)[:12]
    torch.testing.assert_close(seen[0], expected, rtol=0, atol=0)


@pytest.mark.parametrize("position", ["alibi", "rope"])
def test_masks_and_alibi_bias_are_built_once_per_forward_and_match_the_explicit_path(
    position, monkeypatch
):
    import lm.model.masks
    from lm.model.schemes.biases import ALiBi

    fused = tiny(position, n_layer=3)
    explicit = tiny(position, n_layer=3, kernel="math")
    ids = torch.randint(1, 37, (2, 10))
    key_mask = torch.ones(2, 10, dtype=torch.bool)
    key_mask[1, :3] = False  # left padding
    segments = torch.tensor([[0] * 4 + [1] * 6, [0] * 7 + [1] * 3])
    calls = {"alibi_bias": 0, "allowed_keys": 0}
    for owner, name, counter in (
        (ALiBi, "arguments", "alibi_bias"),
        (lm.model.masks, "allowed_keys", "allowed_keys"),
    ):
        real = getattr(owner, name)

        def counted(*args, _real=real, _name=counter, **kw):
            calls[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(owner, name, counted)
    with torch.no_grad():
        a = fused(ids, key_mask=key_mask, segment_ids=segments)
        assert calls == {"alibi_bias": int(position == "alibi"), "allowed_keys": 1}  # not per layer
        b = explicit(ids, key_mask=key_mask, segment_ids=segments)
    real = key_mask  # pads' outputs are unspecified
    torch.testing.assert_close(a[real], b[real], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("position", ["rope", "alibi", ["t5", "kerple", "fire"]], ids=str)
def test_flex_model_builds_one_block_mask_per_forward_and_matches_the_explicit_path(
    position, monkeypatch
):
    import lm.model.masks

    flex = tiny(position, n_layer=3, kernel="flex")
    explicit = tiny(position, n_layer=3, kernel="math")
    ids = torch.randint(1, 37, (2, 10))
    key_mask = torch.ones(2, 10, dtype=torch.bool)
    key_mask[1, :3] = False  # left padding
    segments = torch.tensor([[0] * 4 + [1] * 6, [0] * 7 + [1] * 3])
    built, real_parts = [], lm.model.masks.create_block_mask
    monkeypatch.setattr(
        lm.model.masks, "create_block_mask", lambda *a: built.append(1) or real_parts(*a)
    )
    monkeypatch.setattr(lm.model.masks, "allowed_keys", None)  # no T x T mask tensor may be made
    with torch.no_grad():
        a = flex(ids, key_mask=key_mask, segment_ids=segments)
        assert len(built) == 1  # shared by the three layers
        monkeypatch.undo()
        b = explicit(ids, key_mask=key_mask, segment_ids=segments)
    torch.testing.assert_close(a[key_mask], b[key_mask], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "setting",
    [
        {"rope_scaling": "none"},
        {"rope_scaling": "pi:1"},
        {"rope_scaling": "ntk:1"},
        {"rope_scaling": "yarn:1"},
        {"rope_fraction": 1.0, "rope_original_context": 4},
    ],
    ids=str,
)
def test_rope_without_an_extension_is_the_plain_model_bit_for_bit(setting):
    ids = torch.randint(0, 37, (2, 40))  # past the 16 trained positions too
    with torch.no_grad():
        plain = tiny("rope")
        assert torch.equal(tiny("rope", **setting)(ids), plain(ids))
        assert torch.equal(tiny("rope", **setting)(ids[:, :16]), plain(ids[:, :16]))


BEFORE = Path(__file__).parent / "golden" / "runs_before_plan"


@pytest.mark.parametrize("position", ["rope", "sinusoidal", "learned", "alibi", "none"])
def test_a_run_saved_before_the_plan_loads_and_gives_its_logits(position):
    # Tiny runs trained by lm at 800e6a4, before the forward pass took its shape of position
    # parts and one plan per pass (state dict names, configs without the newer keys), with the
    # logits that code gave on two fixed windows.
    from lm.runs.load import load_run

    run = load_run(BEFORE / position)
    expected = json.loads((BEFORE / "logits.json").read_text())[position]
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1]])
    # On the fused kernel as saved and on the notes' formula written out (the stored logits came
    # from older code: equal to its float rounding, not bit for bit).
    explicit = TransformerLM(dataclasses.replace(run.model.config, kernel="math")).eval()
    explicit.load_state_dict(run.model.state_dict())
    for model, kernel in ((run.model, "sdpa"), (explicit, "math")):
        assert masks(model.config, positions(model.config, ids))[None].kernel == kernel
        with torch.no_grad():
            torch.testing.assert_close(model(ids), torch.tensor(expected), atol=1e-5, rtol=1e-5)
