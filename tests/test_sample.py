"""Decoding: greedy is deterministic; KV cache, batching and long generations change nothing."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _support import fused_calls, tiny_config

from lm.config.names import POSITIONS
from lm.config.sections import ModelConfig
from lm.model.transformer import TransformerLM
from lm.runs.load import load_run
from lm.sample import generate
from lm.training.loop import train


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sample")
    cfg = tiny_config(data={"cache_dir": str(root / "cache")}, train={"max_steps": 30})
    train(cfg, root / "run", quiet=True)
    return load_run(root / "run")


def random_model(position: str, **model) -> TransformerLM:
    torch.manual_seed(3)
    cfg = ModelConfig(
        vocab_size=30,
        context_length=12,
        n_layer=2,
        n_head=2,
        d_model=16,
        position=position,
        **model,
    )
    model = TransformerLM(cfg).eval()
    with torch.no_grad():  # sharper logits than the 0.02-std init, so greedy has no near-ties
        model.embed.weight.mul_(20)
    return model


def test_greedy_is_deterministic_and_cache_equals_recompute(run):
    tok = run.tokenizer
    prompt = [tok.encode("def ")]
    a = generate(run.model, prompt, 40, tok.pad_id, tok.eod_id)
    b = generate(run.model, prompt, 40, tok.pad_id, tok.eod_id)
    c = generate(run.model, prompt, 40, tok.pad_id, tok.eod_id, use_cache=False)
    assert a == b == c
    assert len(tok.decode(a[0])) > 0


# Beside every scheme: the normalizations, p-RoPE and a window, each with the KV cache.
OPTIONS = [
    ("rope", {"normalize": "ssmax"}),
    ("none", {"normalize": "stick_breaking"}),
    ("fox", {"window": [4, None]}),
    (["xpos", "cope"], {"rope_p": 0.5, "window": 3}),
]
CASES = [(p, {}) for p in [*POSITIONS, ["rope", "none"], ["fire", "t5"]]] + OPTIONS


@pytest.mark.parametrize(("position", "options"), CASES, ids=str)
def test_batched_prompts_equal_each_prompt_alone_past_the_context(position, options, block):
    model = random_model(position, **options, **block)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]  # last > context
    alone = [generate(model, [p], 20, pad_id=0)[0] for p in prompts]
    for use_cache in (True, False):
        assert generate(model, prompts, 20, pad_id=0, use_cache=use_cache) == alone
        assert [
            generate(model, [p], 20, pad_id=0, use_cache=use_cache)[0] for p in prompts
        ] == alone


@pytest.mark.parametrize("kernel", ["sdpa", "math"])
@pytest.mark.parametrize(("position", "options"), [*CASES, (["alibi", "kerple"], {})], ids=str)
def test_kv_cache_logits_equal_full_forward_with_left_padding(position, options, kernel, block):
    # Row 0 is padded on the left (its first real token at slot 3), row 1 is not. Without
    # gradients, so that the kernel asked for is the one that runs for every scheme (with them,
    # a learned bias takes the written-out formula on a CPU): SDPA once per layer and forward
    # pass, or never.
    model = random_model(position, kernel=kernel, **options, **block)
    ids = torch.randint(1, 30, (2, 10))
    real = torch.ones(2, 10, dtype=torch.bool)
    real[0, :3] = False
    with torch.no_grad(), fused_calls() as calls:
        full = model(ids, key_mask=real)
        cache = model.new_cache(2, 12)
        steps = [model(ids[:, :4], key_mask=real[:, :4], cache=cache)] + [
            model(ids[:, t : t + 1], cache=cache) for t in range(4, 10)
        ]
    fused = kernel == "sdpa" and options.get("normalize") != "stick_breaking"
    assert len(calls) == (2 * 8 if fused else 0)  # 2 layers, 8 forward passes
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], atol=1e-5, rtol=1e-4)


def test_kv_cache_continues_each_row_and_refuses_to_overflow():

    model = random_model("alibi")
    mask = torch.tensor([[False, False, True, True], [True, True, True, True]])
    cache = model.new_cache(2, 6)
    positions = cache.extend(mask)
    assert positions.tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    # Each row goes on counting its own real tokens: 2 in the left-padded row, 4 in the other.
    positions = cache.extend(torch.ones(2, 1, dtype=torch.bool))
    assert positions.tolist() == [[2], [4]] and cache.length == 5
    key_mask, key_positions = cache.key_mask[:, :5], cache.key_positions[:, :5]
    assert key_mask.tolist() == [[False, False, True, True, True], [True] * 5]
    assert key_positions.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="holds 6 slots; 7 requested"):
        cache.extend(torch.ones(2, 2, dtype=torch.bool))
    assert cache.length == 5  # the refused call recorded nothing

    ids, nxt = torch.randint(1, 30, (2, 4)), torch.randint(1, 30, (2, 2))
    cache = model.new_cache(2, 6)
    model(ids, key_mask=mask, cache=cache)
    with pytest.raises(ValueError, match="holds 6 slots; 7 requested"):
        model(torch.randint(1, 30, (2, 3)), cache=cache)
    full_mask = torch.cat([mask, torch.ones_like(nxt, dtype=torch.bool)], dim=1)
    full = model(torch.cat([ids, nxt], dim=1), key_mask=full_mask)
    torch.testing.assert_close(model(nxt, cache=cache), full[:, 4:], atol=1e-5, rtol=1e-4)


def test_sampling_is_reproducible_with_a_seed(run):
    tok = run.tokenizer
    kw = dict(temperature=1.0, top_k=10)
    a = generate(run.model, [tok.encode("The ")], 30, tok.pad_id, seed=5, **kw)
    b = generate(run.model, [tok.encode("The ")], 30, tok.pad_id, seed=5, **kw)
    c = generate(run.model, [tok.encode("The ")], 30, tok.pad_id, seed=6, **kw)
    assert a == b and a != c


def test_generation_stops_at_end_of_document():
    model = random_model("rope")
    first = generate(model, [[1, 2]], 1, pad_id=0)[0][0]
    # Declaring that very token the end-of-document marker stops the row before it.
    assert generate(model, [[1, 2]], 10, pad_id=0, eod_id=first) == [[]]


@pytest.mark.parametrize("position", ["rope", "sinusoidal", "learned", "alibi", "none"])
def test_sampled_continuation_does_not_depend_on_its_neighbours(position):
    model = random_model(position)
    with torch.no_grad():  # softer logits than random_model's, so sampling really varies
        model.embed.weight.div_(20)
    prompt, other = [1, 2, 3], [7, 8, 9, 10, 11]
    kw = dict(pad_id=0, temperature=1.0, seed=5)
    alone = generate(model, [prompt], 16, **kw)[0]  # runs past the context of 12
    assert generate(model, [prompt, other], 16, **kw)[0] == alone
    assert generate(model, [other, prompt], 16, **kw)[1] == alone
    assert generate(model, [other, prompt], 16, use_cache=False, **kw)[1] == alone
    # The seed still matters, and neighbours sampled from the same seed differ.
    assert generate(model, [prompt], 16, **{**kw, "seed": 6})[0] != alone
    assert generate(model, [other], 16, **kw)[0] != alone


def test_a_row_that_ends_early_leaves_the_others_decoding():
    model = random_model("rope")
    short, long = [1, 2], [11, 12]
    eod = generate(model, [short], 1, pad_id=0)[0][0]
    alone = generate(model, [long], 40, pad_id=0)[0]
    expected = alone[: alone.index(eod)] if eod in alone else alone
    assert len(expected) > 16  # the long row outlives the first all-done check
    # Row 0 ends at once; row 1 runs on (past several all-done checks) up to its own end.
    assert generate(model, [short, long], 40, pad_id=0, eod_id=eod) == [[], expected]


@pytest.mark.parametrize(
    "extension",
    [
        {"rope_scaling": "pi:4"},
        {"rope_scaling": "ntk:4"},
        {"rope_scaling": "yarn:4"},
        {"rope_scaling": "yarn:2", "rope_fraction": 0.5},
    ],
    ids=str,
)
def test_every_rope_extension_decodes_as_a_full_forward_and_each_prompt_alone(extension):

    model = random_model("rope", **extension)
    ids = torch.randint(1, 30, (2, 10))
    cache = model.new_cache(2, 12)
    steps = [model(ids[:, :4], cache=cache)] + [
        model(ids[:, t : t + 1], cache=cache) for t in range(4, 10)
    ]
    torch.testing.assert_close(torch.cat(steps, dim=1), model(ids), atol=1e-5, rtol=1e-4)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]
    alone = [generate(model, [p], 16, pad_id=0)[0] for p in prompts]
    for use_cache in (True, False):
        assert generate(model, prompts, 16, pad_id=0, use_cache=use_cache) == alone


@pytest.mark.parametrize("position", ["rope", "alibi", "t5", "kerple", "fire", "fox", "xpos"])
def test_the_one_token_step_compiles_as_one_graph_and_decodes_the_same(position, monkeypatch):
    # Dynamo traces the step whole (fullgraph: a graph break is an error) and compiles it at most
    # twice over 24 tokens (the first, then one for the growing cache); Inductor is swapped for
    # Dynamo's eager backend to keep the test fast: the tracing is what is checked here.
    import torch._dynamo
    from torch._dynamo.utils import counters

    import lm.sample

    def traced(model, device, *, fullgraph, setting):
        assert fullgraph
        return torch.compile(model, backend="eager", fullgraph=True)

    monkeypatch.setattr(lm.sample, "compile_model", traced)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, context_length=32, n_layer=2, n_head=2, d_model=16)
    model = TransformerLM(dataclasses.replace(cfg, position=position)).eval()
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10, 11]]
    torch._dynamo.reset()
    counters.clear()
    compiled = generate(model, prompts, 24, pad_id=0, compile_step=True)
    assert 1 <= counters["stats"]["unique_graphs"] <= 2  # compiled, and at most once more
    assert compiled == generate(model, prompts, 24, pad_id=0)


def test_recompute_decoding_gives_flex_one_length_and_the_same_tokens(monkeypatch):
    import dataclasses

    import torch.nn.functional as F

    import lm.model.attention
    from lm.config.sections import ModelConfig
    from lm.model.transformer import TransformerLM
    from lm.sample import generate

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=20, context_length=16, n_layer=2, n_head=2, d_model=16)
    sdpa = TransformerLM(cfg).eval()
    flex = TransformerLM(dataclasses.replace(cfg, kernel="flex")).eval()
    flex.load_state_dict(sdpa.state_dict())
    lengths = []

    def fake_flex(
        q, k, v, score_mod=None, block_mask=None, enable_gqa=False
    ):  # records what would compile
        lengths.append(q.shape[-2])
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=enable_gqa)

    monkeypatch.setattr(lm.model.attention, "flex", fake_flex)
    prompts = [[1, 2, 3], [4, 5, 6]]  # one length: flex reads no padding mask here
    want = generate(sdpa, prompts, 10, pad_id=0, use_cache=False)
    assert generate(flex, prompts, 10, pad_id=0, use_cache=False) == want
    assert len(set(lengths)) == 1  # one compiled kernel for every step
