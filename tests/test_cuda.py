"""The GPU paths on a CUDA device: fused kernels, bf16, the KV cache, compiling, training and
evaluation memory. Every test here skips where there is no CUDA device; scripts/gpu_check.sh
runs them on one."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from _support import (
    assert_bf16_step_matches_fp32,
    assert_padding_is_invisible,
    attention_layer,
    metrics,
    self_attend,
    tiny_config,
)

from lm.config.sections import DataConfig, ModelConfig
from lm.data.sources import TokenizedSplit
from lm.evaluate import evaluate
from lm.model.transformer import TransformerLM, loss_sum
from lm.runs.checkpoint import complete_checkpoints
from lm.runtime.device import autocast_context, compile_model
from lm.sample import generate
from lm.training.loop import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
RETHOUGHT = ["pope", "fope", "hope", "dape", "path"]  # the schemes of 2024-25 that rethink RoPE


@pytest.fixture(autouse=True)
def _full_fp32_matmuls():
    """Comparisons in fp32 mean fp32: the trainer allows TF32 process-wide (10-bit mantissa),
    which would loosen every later comparison; each test starts without it and leaves none."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    torch.cuda.empty_cache()


def _padding(B: int, L: int) -> torch.Tensor:
    key_mask = torch.ones(B, L, dtype=torch.bool, device=CUDA)
    key_mask[0, :7] = False  # left padding: under the causal mask, rows 0-6 see no real key
    key_mask[1, -5:] = False  # right padding
    return key_mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_equals_the_notes_explicit_attention(dtype, position, causal):
    # bf16 is where CUDA picks the flash and memory-efficient kernels; the reference is the
    # explicit softmax in fp32 on the same (bf16-rounded) weights and inputs.
    torch.manual_seed(1)
    fused, cfg = attention_layer(64, 4, position=position, kernel="sdpa")
    explicit, explicit_cfg = attention_layer(64, 4, position=position, kernel="math")
    fused, explicit = fused.to(CUDA, dtype), explicit.to(CUDA)
    explicit.load_state_dict({k: v.float() for k, v in fused.state_dict().items()})
    x = torch.randn(3, 40, 64, device=CUDA).to(dtype)
    tol = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 5e-2}
    with torch.no_grad():
        for key_mask in (None, _padding(3, 40)):
            a = self_attend(fused, cfg, x, key_mask=key_mask, causal=causal)
            b = self_attend(explicit, explicit_cfg, x.float(), key_mask=key_mask, causal=causal)
            assert a.dtype == dtype and torch.isfinite(a).all()
            torch.testing.assert_close(a.float(), b, **tol)


@pytest.mark.parametrize("position", ["rope", "learned", "alibi", *RETHOUGHT])
def test_padded_batch_gives_each_real_token_its_unpadded_logits(position):
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=37, context_length=32, n_layer=2, n_head=2, d_model=32, position=position
    )
    model = TransformerLM(cfg).to(CUDA).eval()
    seqs = [torch.randint(1, 37, (n,), device=CUDA) for n in (19, 4, 11)]
    assert_padding_is_invisible(model, seqs, T=24)


@pytest.mark.parametrize("position", ["rope", "learned", *RETHOUGHT])
def test_bf16_autocast_step_matches_fp32_within_bf16_precision(position):
    cfg = dataclasses.replace(tiny_config().model, vocab_size=40, position=position)
    torch.manual_seed(0)
    model = TransformerLM(cfg).to(CUDA)
    ids = torch.randint(0, cfg.vocab_size, (4, cfg.context_length + 1), device=CUDA)
    assert_bf16_step_matches_fp32(model, ids, CUDA)


def _sharp_model(position: str) -> TransformerLM:
    torch.manual_seed(3)
    cfg = ModelConfig(
        vocab_size=30, context_length=12, n_layer=2, n_head=2, d_model=16, position=position
    )
    model = TransformerLM(cfg).to(CUDA).eval()
    with torch.no_grad():  # sharper logits than the 0.02-std init, so greedy has no near-ties
        model.embed.weight.mul_(20)
    return model


@pytest.mark.parametrize("position", ["rope", "sinusoidal", "learned", "alibi", "none", *RETHOUGHT])
def test_kv_cache_decoding_equals_recomputation(position):
    model = _sharp_model(position)
    ids = torch.randint(1, 30, (2, 10), device=CUDA)
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(2, 12)
        steps = [model(ids[:, :4], cache=cache)]
        steps += [model(ids[:, t : t + 1], cache=cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]]  # last > context
    cached = generate(model, prompts, 20, pad_id=0)
    assert cached == generate(model, prompts, 20, pad_id=0, use_cache=False)
    assert cached == [generate(model, [p], 20, pad_id=0)[0] for p in prompts]


def test_compiled_decoding_step_gives_the_eager_tokens():
    cfg = dataclasses.replace(tiny_config().model, vocab_size=40)
    torch.manual_seed(0)
    model = TransformerLM(cfg).to(CUDA).eval()
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10, 11]]
    eager = generate(model, prompts, 20, pad_id=0)
    assert generate(model, prompts, 20, pad_id=0, compile_step=True) == eager


def test_compiled_model_matches_eager_loss_and_gradients():
    cfg = dataclasses.replace(tiny_config().model, vocab_size=40)
    torch.manual_seed(0)
    eager = TransformerLM(cfg).to(CUDA)
    twin = TransformerLM(cfg).to(CUDA)
    twin.load_state_dict(eager.state_dict())
    compiled = compile_model(twin, CUDA)
    ids = torch.randint(0, cfg.vocab_size, (3, cfg.context_length + 1), device=CUDA)
    loss = [loss_sum(model(ids[:, :-1]), ids[:, 1:]) for model in (eager, compiled)]
    torch.testing.assert_close(loss[1], loss[0], rtol=1e-4, atol=0)
    for x in loss:
        x.backward()
    for (name, a), b in zip(eager.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize("position", ["rope", "alibi", "pope", "fope"])
def test_compiled_model_puts_documents_and_alibi_through_flex_with_eager_gradients(
    position, monkeypatch
):
    # Compiled for a GPU, the sdpa kernel sends document masks and ALiBi to FlexAttention (no
    # T x T mask tensor); loss and gradients equal the eager model's SDPA-with-a-mask.
    import lm.model.masks

    cfg = dataclasses.replace(tiny_config().model, vocab_size=40, position=position)
    torch.manual_seed(0)
    eager = TransformerLM(cfg).to(CUDA)
    twin = TransformerLM(cfg).to(CUDA)
    twin.load_state_dict(eager.state_dict())
    L = cfg.context_length
    ids = torch.randint(0, cfg.vocab_size, (3, L + 1), device=CUDA)
    segments = (torch.arange(L, device=CUDA) >= L // 3).long().expand(3, -1).contiguous()
    losses = [loss_sum(eager(ids[:, :-1], segment_ids=segments), ids[:, 1:])]
    monkeypatch.setattr(lm.model.masks, "allowed_keys", None)  # a T x T mask tensor would fail here
    compiled = compile_model(twin, CUDA)
    losses.append(loss_sum(compiled(ids[:, :-1], segment_ids=segments), ids[:, 1:]))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=0)
    for x in losses:
        x.backward()
    for (name, a), b in zip(eager.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize(("dtype", "compile_"), [("bf16", None), ("fp32", False)])
def test_training_on_cuda_evaluates_checkpoints_and_the_loss_falls(tmp_path, dtype, compile_):
    # compile left out (None) is what a GPU user gets: torch.compile on CUDA.
    cfg = tiny_config(train={"device": "cuda", "dtype": dtype, "compile": compile_})
    result = train(cfg, tmp_path / "run", quiet=True)
    assert result.status == "done" and result.step == 30
    lines = metrics(tmp_path / "run")
    train_losses = [m["train_loss"] for m in lines if "train_loss" in m]
    val_losses = [m["val_loss"] for m in lines if "val_loss" in m]
    assert all(np.isfinite(train_losses)) and all(np.isfinite(val_losses))
    assert len(val_losses) == 2
    assert train_losses[-1] < train_losses[0] - 0.5
    assert [p.name for p in complete_checkpoints(tmp_path / "run")] == [
        "step_00000020",
        "step_00000030",
    ]


def test_evaluation_memory_is_one_batch_and_does_not_pile_up():
    # GPT-2 small's width, context and vocabulary (two layers): the logits dominate.
    V, T, B = 50304, 1024, 4
    cfg = ModelConfig(vocab_size=V, context_length=T, n_layer=2, n_head=12, d_model=768)
    torch.manual_seed(0)
    model = TransformerLM(cfg).to(CUDA)
    rng = np.random.default_rng(0)
    n = B * T * 6 + 1
    split = TokenizedSplit(
        tokens=rng.integers(0, V, size=n).astype(np.uint32), offsets=np.array([0, n])
    )
    autocast = autocast_context(CUDA, torch.bfloat16)

    def peak_bytes(max_batches: int) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss, count = evaluate(model, split, DataConfig(), T, B, 0, CUDA, autocast, max_batches)
        assert np.isfinite(loss) and count == B * T * max_batches
        return torch.cuda.max_memory_allocated() - base

    one, six = peak_bytes(1), peak_bytes(6)
    assert six <= one * 1.05 + 2**20, (one, six)  # nothing from earlier batches is kept
    # At most a few logit-sized tensors at once (bf16 logits, an fp32 copy, its log-softmax):
    # never an autograd graph, never a whole split's logits.
    assert one < 12 * B * T * V, one


def test_measured_matmul_peak_is_plausible_against_the_datasheet():
    path = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"
    spec = importlib.util.spec_from_file_location("bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    found = bench.datasheet_peak(torch.cuda.get_device_name(CUDA), "bf16")
    if found is None:
        pytest.skip(f"no datasheet figure for {torch.cuda.get_device_name(CUDA)}")
    measured = bench.matmul_peak(torch.bfloat16, CUDA) / 1e12
    # Above the datasheet means the timing missed work (an unsynchronised clock); far below,
    # that launch overhead or a slow kernel dominates the measurement.
    assert 0.3 * found[1] < measured < 1.05 * found[1], (found, measured)
