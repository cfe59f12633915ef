"""What MFU is made of: the model's FLOPs per token and the peak it is divided by."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from lm.config.load import load_config
from lm.config.sections import ModelConfig
from lm.model.transformer import TransformerLM

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("position", ["learned", "rope"])
def test_flops_per_token_counts_every_matmul_weight_and_the_head(tied, position):
    V, C, L, d, ff, T = 37, 16, 3, 16, 64, 12
    cfg = ModelConfig(
        vocab_size=V,
        context_length=C,
        n_layer=L,
        n_head=2,
        d_model=d,
        position=position,
        tie_embeddings=tied,
    )
    model = TransformerLM(cfg)
    # By hand: per block two norms (no bias), W_QKV, W_O and the MLP's two matrices; then the
    # final norm and the vocab x d head, a full matmul even when it shares E. Embedding and
    # position tables are lookups and do not count.
    per_block = 2 * d + 3 * d * d + d * d + d * ff + ff * d
    n = L * per_block + d + V * d
    assert model.flops_per_token(T) == 6 * n + 12 * L * d * T
    # Tying saves parameters, not arithmetic.
    distinct = V * d * (1 if tied else 2) + (C * d if position == "learned" else 0)
    assert model.num_parameters() == L * per_block + d + distinct


def test_gpt2_small_flops_include_the_tied_head():
    shape = dict(context_length=1024, n_layer=12, n_head=12, d_model=768, position="learned")
    cfg = ModelConfig(vocab_size=50304, **shape)
    model = TransformerLM(cfg)
    head = 50304 * 768
    without_head = 6 * model.num_parameters(non_embedding=True) + 12 * 12 * 768 * 1024
    # The head is about a quarter of GPT-2 small's training FLOPs; leaving it out undercounts.
    assert model.flops_per_token(1024) == without_head + 6 * head
    assert 0.25 < 6 * head / model.flops_per_token(1024) < 0.3


@pytest.mark.parametrize(
    ("name", "precision", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", ("H100 SXM bf16", 989.5)),
        ("NVIDIA H100 PCIe", "bf16", ("H100 PCIe bf16", 756.5)),
        ("NVIDIA H100 NVL", "tf32", ("H100 NVL tf32", 417.5)),
        ("NVIDIA H200", "bf16", ("H200 SXM bf16", 989.5)),
        ("NVIDIA H200 NVL", "bf16", ("H200 NVL bf16", 835.5)),
        ("NVIDIA GH200 480GB", "bf16", ("GH200 bf16", 989.5)),
        ("NVIDIA A100-SXM4-80GB", "bf16", ("A100 bf16", 312.0)),
        ("NVIDIA A100-PCIE-40GB", "tf32", ("A100 tf32", 156.0)),
        ("NVIDIA A10G", "bf16", ("A10G bf16", 125.0)),
        ("NVIDIA A10", "fp32", ("A10 fp32", 31.2)),
        ("NVIDIA L4", "bf16", ("L4 bf16", 121.0)),
        ("NVIDIA L40S", "bf16", ("L40S bf16", 362.0)),
        ("NVIDIA GeForce RTX 4090", "bf16", ("RTX 4090 bf16", 165.2)),
        ("Tesla V100-SXM2-16GB", "fp16", ("V100 SXM2 fp16", 125.0)),
        ("Tesla V100-PCIE-32GB", "fp16", ("V100 PCIe fp16", 112.0)),
        ("Tesla V100S-PCIE-32GB", "fp16", ("V100S PCIe fp16", 130.0)),
        # No TF32 on Volta: cuBLAS runs such a matmul in plain fp32.
        ("Tesla V100-SXM2-16GB", "tf32", ("V100 SXM2 fp32", 15.7)),
        ("Tesla T4", "fp16", ("T4 fp16", 65.0)),
    ],
)
def test_datasheet_peak_names_known_gpus(bench, name, precision, expected):
    assert bench.datasheet_peak(name, precision) == expected


@pytest.mark.parametrize(
    ("name", "precision"),
    [
        ("NVIDIA GeForce RTX 3090", "bf16"),  # not in the table
        ("NVIDIA L40", "bf16"),  # neither L4 nor L40S
        ("NVIDIA H800", "bf16"),
        ("NVIDIA GeForce RTX 4090 D", "bf16"),  # a cut-down 4090
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16"),  # a slice of the GPU, not all of it
        ("Tesla V100-SXM2-16GB", "bf16"),  # Volta's tensor cores have no bf16
        ("cpu", "fp32"),
        ("", "bf16"),
    ],
)
def test_datasheet_peak_is_none_where_no_datasheet_applies(bench, name, precision):
    assert bench.datasheet_peak(name, precision) is None


def test_peak_comes_from_the_flag_else_a_measurement_off_cuda(bench):
    cpu = torch.device("cpu")
    assert bench.resolve_peak("bf16", cpu, 123.0) == (
        123e12,
        "given (--peak-tflops) 123 TFLOP/s",
    )
    assert bench.matmul_precision("fp32", cpu) == "fp32"
    # A measured figure is a plain positive rate, and says so.
    flops = bench.matmul_peak(torch.float32, cpu, n=128, window_s=0.01)
    assert 0 < flops < float("inf")


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--peak-tflops=0", "must be a finite number > 0"),
        ("--peak-tflops=fast", "is not a number"),
        ("--dtypes=fp8", "--dtypes: fp8 not among fp32, bf16"),
        ("--batch=0", "must be at least 1"),
    ],
)
def test_bad_flags_are_refused_before_any_work(bench, monkeypatch, capsys, flag, message):
    monkeypatch.setattr(sys, "argv", ["bench.py", flag])
    with pytest.raises(SystemExit) as exit_:
        bench.main()
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_profile_names_the_ops_of_a_training_step_by_their_share(bench):
    bench.SHAPES["tiny"] = (dict(n_layer=1, n_head=2, d_model=32, context_length=16), 2)
    try:
        run = bench.Training("tiny", "fp32", False, torch.device("cpu"))
        text = bench.profile_steps(run, 2)
    finally:
        del bench.SHAPES["tiny"]
    assert text.startswith("tiny fp32 rope: 2 steps profiled")
    assert "aten::mm" in text and "Self CPU %" in text
    assert not run.step_times  # profiled steps are not timed


def test_fused_layer_norm_rows_swap_only_the_norms(bench):
    bench.SHAPES["tiny"] = (dict(n_layer=1, n_head=2, d_model=32, context_length=16), 2)
    try:
        ours, fused = (
            bench.Training("tiny", "fp32", False, torch.device("cpu"), fused_norm=f)
            for f in (False, True)
        )
    finally:
        del bench.SHAPES["tiny"]
    norms = [m for m in fused.model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 3 and all(type(m) is torch.nn.LayerNorm for m in norms)
    assert fused.label == "rope (fused LayerNorm)" and ours.label == "rope"
    ids = torch.randint(0, 65, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(fused.model(ids), ours.model(ids))  # the same model


@pytest.mark.parametrize("shape", ["main", "nanogpt-cpu", "shakespeare-gpu", "gpt2-small"])
def test_the_llama_block_row_has_the_gpt2_blocks_parameter_count(bench, shape):
    # --block compares tokens/s at equal size: the SwiGLU width is chosen for it, so the two
    # blocks' counts differ by less than one multiple of 8 of that width per block.
    model_kw = bench.SHAPES[shape][0]
    gpt2 = ModelConfig(**{"vocab_size": 65, **model_kw})
    llama = ModelConfig(
        **{"vocab_size": 65, **model_kw, **bench.variant(bench.llama_block(model_kw))}
    )
    assert (llama.norm, llama.mlp, llama.n_kv_head) == ("rmsnorm", "swiglu", gpt2.n_head // 2)
    a, b = TransformerLM(gpt2).num_parameters(), TransformerLM(llama).num_parameters()
    assert abs(a - b) <= gpt2.n_layer * (3 * 4 * gpt2.d_model + 2 * gpt2.d_model)
    assert abs(a - b) / a < 0.01


@pytest.mark.parametrize(
    ("shape", "config", "batch"),
    [("flipflop", "flipflop.yaml", None), ("length-curve", "extrapolation.yaml", 16)],
)
def test_an_experiments_shape_is_the_model_its_runs_train(bench, shape, config, batch):
    # docs/sweeps.md times the documented experiments' steps at these shapes: each must be the
    # model and batch its config trains (the length curve sets train.batch_size=16), and the
    # vocabulary its characters give (the parameter count its report prints).
    model_kw, shape_batch = bench.SHAPES[shape]
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / config)
    assert shape_batch == (batch or cfg.train.batch_size)
    dims = ("n_layer", "n_head", "d_model", "context_length", "position")
    assert {k: model_kw[k] for k in dims} == {k: getattr(cfg.model, k) for k in dims}
    bench_model = TransformerLM(ModelConfig(**model_kw))
    run_model = TransformerLM(dataclasses.replace(cfg.model, vocab_size=model_kw["vocab_size"]))
    assert bench_model.num_parameters() == run_model.num_parameters()
    reported = {"flipflop": 99_200, "length-curve": 801_152}[shape]  # their report.md's rope row
    assert bench_model.num_parameters() == reported


def test_block_rows_train_side_by_side_and_print_their_ratio(bench, monkeypatch, capsys, tmp_path):
    bench.SHAPES["tiny"] = (dict(n_layer=1, n_head=2, d_model=32, context_length=16), 2)
    argv = ["bench.py", "--shapes", "tiny", "--dtypes", "fp32", "--steps", "2", "--warmup", "1"]
    argv += ["--block", "--out", str(tmp_path / "b.json")]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        assert bench.main() == 0
    finally:
        del bench.SHAPES["tiny"]
    out = capsys.readouterr().out
    assert "rope+norm=rmsnorm+mlp=swiglu+n_kv_head=1+d_ff=" in out
    assert "/ rope tokens/s" in out


def test_decode_kv_rows_measure_cache_bytes_falling_by_the_group_size(bench):
    shape = dict(vocab_size=11, n_layer=2, n_head=4, d_model=32, context_length=24)
    rows = bench.bench_decode_kv(torch.device("cpu"), new_tokens=4, reps=1, shape=shape)
    assert [r["n_kv_head"] for r in rows] == [4, 2, 1]
    full = rows[0]["cache_bytes"]
    assert full == 2 * 2 * 4 * 24 * 8 * 4  # keys and values, layers, heads, slots, d_k, fp32
    assert [full // r["cache_bytes"] for r in rows] == [1, 2, 4]
    assert all(r["kv_cache_tokens_per_s"] > 0 for r in rows)


def test_attention_fading_measures_an_even_spread_as_ln_n_and_its_far_weight():
    """scripts/attention_fading.py on causal maps that spread every query evenly over the keys
    it may read: entropy ln(l + 1) at query l, and the share of keys further back than C."""
    path = BENCH.parent / "attention_fading.py"
    spec = importlib.util.spec_from_file_location("attention_fading", path)
    fading = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fading)
    C, T = 8, 64
    even = torch.tril(torch.ones(T, T)).double()
    maps = (even / even.sum(-1, keepdim=True)).numpy()[None, None]  # (layer, head, T, T)
    near, far, beyond = fading.measure(maps, C)
    ln = torch.log(torch.arange(1, T + 1).double())
    assert near == pytest.approx(float(ln[C // 2 : C].mean()))
    assert far == pytest.approx(float(ln[T - C :].mean()))
    # Query l reads l + 1 keys, of which l - C + 1 lie C or more back.
    shares = [(q - C + 1) / (q + 1) for q in range(T - C, T)]
    assert beyond == pytest.approx(sum(shares) / C)
    # A query that reads only itself: nothing spreads, nothing lies far back.
    eye = torch.eye(T).double().numpy()[None, None]
    assert fading.measure(eye, C) == (0.0, 0.0, 0.0)
