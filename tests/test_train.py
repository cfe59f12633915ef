"""The training loop: exact resume, gradient accumulation, DDP, run-directory safety."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import platform
import subprocess
import sys

import pytest
import torch
from _support import (
    BLOCKS,
    assert_bf16_step_matches_fp32,
    assert_same_weights,
    losses,
    metrics,
    nan_loss_at_step,
    tiny_config,
    varied_corpus,
    weights,
    write_config,
)

from lm.config.errors import ConfigError, LMError
from lm.config.names import POSITIONS
from lm.data.batches import PaddedCollator
from lm.model.transformer import TransformerLM, loss_sum
from lm.runs.checkpoint import complete_checkpoints, latest_checkpoint
from lm.runtime.device import compile_model
from lm.training.loop import train
from lm.training.optim import build_optimizer, lr_at, orthogonalize

# The schemes of 2024-25 that rethink RoPE, one per layer.
RETHOUGHT = ["pope", "fope", "hope", "dape", "path"]


def test_training_writes_metrics_checkpoints_and_loss_falls(tmp_path):
    result = train(tiny_config(), tmp_path / "run", quiet=True)
    assert result.status == "done" and result.step == 30
    lines = metrics(tmp_path / "run")
    train_lines = [m for m in lines if "train_loss" in m]
    assert all(
        {"step", "elapsed_s", "train_loss", "lr", "tokens_per_s"} <= m.keys() for m in train_lines
    )
    assert [m["step"] for m in lines if "val_loss" in m] == [15, 30]
    assert train_lines[-1]["train_loss"] < train_lines[0]["train_loss"] - 0.5
    assert [p.name for p in complete_checkpoints(tmp_path / "run")] == [
        "step_00000020",
        "step_00000030",
    ]
    for name in ("config.yaml", "tokenizer.json", "run.json"):
        assert (tmp_path / "run" / name).is_file()


@pytest.mark.parametrize(
    ("optimizer", "model"),
    [
        ("adamw", {}),
        ("muon", {}),
        ("adamw", {"random_positions": 96}),
        ("adamw", {"position": ["fox", "cope"], "normalize": "ssmax", "window": [8, None]}),
        ("muon", {"position": ["xpos", "sandwich"], "rope_p": 0.5}),
        ("adamw", {"position": "none", "normalize": "stick_breaking"}),
        ("adamw", {"n_layer": 5, "position": RETHOUGHT}),
        ("adamw", BLOCKS["llama"]),
        ("muon", {**BLOCKS["llama"], "position": ["fox", "cope"], "window": [8, None]}),
        ("adamw", {**BLOCKS["llama"], "n_layer": 5, "position": RETHOUGHT}),
    ],
    ids=[
        "adamw",
        "muon",
        "random-positions",
        "fox-cope-ssmax-window",
        "xpos-sandwich-p-rope",
        "stick-breaking",
        "pope-fope-hope-dape-path",
        "llama-block",
        "llama-block-fox-cope-muon",
        "llama-block-pope-fope-hope-dape-path",
    ],
)
def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, optimizer, model):
    # Random positions are drawn from torch's generator, whose state the checkpoint keeps.
    cfg = tiny_config(
        model=model,
        train={"max_steps": 24, "checkpoint_every": 8, "eval_every": 12, "optimizer": optimizer},
    )
    train(cfg, tmp_path / "straight", quiet=True)
    # Crash at step 13 (between checkpoints 8 and 16), then resume from checkpoint 8.
    with nan_loss_at_step(13):
        crashed = train(cfg, tmp_path / "resumed", quiet=True)
    assert crashed.status == "nonfinite" and latest_checkpoint(tmp_path / "resumed").name.endswith(
        "8"
    )
    done = train(cfg, tmp_path / "resumed", resume=True, quiet=True)
    assert done.status == "done"
    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")
    assert losses(tmp_path / "resumed", "val_loss") == losses(tmp_path / "straight", "val_loss")
    assert_same_weights(tmp_path / "resumed", tmp_path / "straight")


@pytest.mark.parametrize(
    ("model", "optimizer"),
    [({"position": "rope"}, "adamw"), ({"position": "fire", "bias": True}, "muon")],
    ids=["rope-adamw", "fire-bias-muon"],
)
def test_a_run_is_the_same_on_one_thread_and_on_two(tmp_path, model, optimizer):
    # lm compare --jobs N trains its runs on fewer threads than a run alone: the numbers must
    # not care. Wide enough that PyTorch's kernels split their sums between threads.
    cfg = {"context_length": 64, "n_layer": 2, "n_head": 2, "d_model": 64, **model}
    for threads in (1, 2):
        train(
            tiny_config(model=cfg, train={"max_steps": 10, "threads": threads, "eval_every": 5,
                                          "optimizer": optimizer}),
            tmp_path / f"threads{threads}",
            quiet=True,
        )  # fmt: skip
    one, two = tmp_path / "threads1", tmp_path / "threads2"
    assert losses(one) == losses(two) and losses(one, "val_loss") == losses(two, "val_loss")
    assert_same_weights(one, two)


def _step_gradients(model_keys: dict, threads: int, padded: bool) -> dict[str, torch.Tensor]:
    """One training step's loss gradients of a model at the copy task's shape (2 layers, width
    64, 32 sequences of 40 tokens), computed on ``threads`` threads from the same start."""
    from lm.config.sections import ModelConfig

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        config = ModelConfig(vocab_size=16, context_length=40, n_layer=2, n_head=4, d_model=64)
        model = TransformerLM(dataclasses.replace(config, **model_keys)).train()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 16, (32, 40), generator=g)
        lengths = torch.randint(20, 41, (32,), generator=g)
        key_mask = torch.arange(40)[None] < lengths[:, None] if padded else None
        loss = loss_sum(model(ids, key_mask=key_mask)[:, :-1], ids[:, 1:]) / ids.numel()
        loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("kernel", ["sdpa", "math"])
def test_every_schemes_gradients_are_the_same_on_one_thread_and_on_two(position, kernel):
    # A learned score bias once took its gradient through SDPA's math path (a softmax backward
    # that sums per thread), T5's table through index_put and FIRE's scalars through whole-tensor
    # sums: each differed between 1 and 2 threads from the first step at this shape.
    keys = {"position": position, "kernel": kernel}
    for padded in (True, False):
        one, two = _step_gradients(keys, 1, padded), _step_gradients(keys, 2, padded)
        differ = [name for name in one if not torch.equal(one[name], two[name])]
        assert differ == [], f"{position} ({kernel}, padded={padded}): {differ}"


def test_gradient_accumulation_equals_one_big_batch_with_padding(tmp_path):
    corpus = varied_corpus(tmp_path / "docs.jsonl")
    base = {"data": {"source": str(corpus), "mode": "padded"}, "model": {"context_length": 16}}
    results = {}
    for accum in (1, 2, 4):
        cfg = tiny_config(
            **base, train={"max_steps": 6, "grad_accum": accum, "eval_every": 6, "log_every": 1}
        )
        train(cfg, tmp_path / f"a{accum}", quiet=True)
        results[accum] = losses(tmp_path / f"a{accum}")
    for accum in (2, 4):
        for step, loss in results[1].items():
            assert results[accum][step] == pytest.approx(loss, rel=1e-5)
    wa, wb = weights(tmp_path / "a1"), weights(tmp_path / "a4")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5)


def test_padded_batch_step_equals_sequences_one_at_a_time():
    torch.manual_seed(0)
    from lm.config.sections import ModelConfig

    model = TransformerLM(
        ModelConfig(vocab_size=20, context_length=16, n_layer=2, n_head=2, d_model=16)
    )
    seqs = [list(range(1, 10)), [3, 4, 5], [7, 2, 9, 9, 1, 4]]
    collate = PaddedCollator(pad_id=0)
    batch = collate(seqs)
    n = int(batch["loss_mask"].sum())
    assert n == sum(len(s) - 1 for s in seqs)
    logits = model(batch["input_ids"], key_mask=batch["key_mask"])
    loss = loss_sum(logits, batch["targets"], batch["loss_mask"]) / n
    loss.backward()
    batched = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = 0.0
    for s in seqs:
        one = collate([s])
        part = loss_sum(model(one["input_ids"]), one["targets"]) / n
        part.backward()
        total += part.item()
    assert loss.item() == pytest.approx(total, rel=1e-6)
    for g, p in zip(batched, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("model", "parallel"),
    [
        ({"n_layer": 4, "position": ["fox", "cope", "xpos", "sandwich"], "rope_p": 0.5,
          "normalize": "ssmax", "window": [8, None, "..."]}, "ddp"),
        ({"position": "none", "normalize": "stick_breaking"}, "ddp"),
        ({"n_layer": 5, "position": RETHOUGHT}, "ddp"),
        ({"n_layer": 5, "position": RETHOUGHT}, "fsdp"),
        ({"n_layer": 4, "position": ["fox", "cope", "xpos", "sandwich"], "rope_p": 0.5,
          **BLOCKS["llama"]}, "ddp"),
    ],
    ids=["newer-schemes", "stick-breaking", "pope-fope-hope-dape-path", "those-under-fsdp",
         "newer-schemes-llama-block"],
)  # fmt: skip
def test_two_process_ddp_matches_one_process(tmp_path, model, parallel):
    steps = {"max_steps": 6, "eval_every": 6, "log_every": 1, "batch_size": 8}
    path = write_config(tmp_path / "c.yaml", model=model, train={**steps, "parallel": parallel})
    train(tiny_config(model=model, train=steps), tmp_path / "one", quiet=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "lm",
        "train",
        str(path),
        "--out",
        str(tmp_path / "two"),
        "--quiet",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert one.keys() == two.keys()
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5)
    assert losses(tmp_path / "two", "val_loss")[6] == pytest.approx(
        losses(tmp_path / "one", "val_loss")[6], rel=1e-5
    )
    # The weights too, up to the order of the gradient's sums (Adam divides each step by the
    # gradient's own size, so a weight whose gradient is near zero can move by ~1e-5); a rank
    # that trained on its own half of the batch differs by the weights' 1e-2.
    one, two = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-4, msg=k)


def test_refuses_to_overwrite_a_run_changing_nothing(tmp_path):
    cfg = tiny_config(train={"max_steps": 10, "eval_every": 10})
    train(cfg, tmp_path / "run", quiet=True)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")}
    with pytest.raises(LMError, match="already holds a run"):
        train(cfg, tmp_path / "run", quiet=True)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")} == before
    again = train(cfg, tmp_path / "run", overwrite=True, quiet=True)
    assert again.status == "done"
    assert [m["step"] for m in metrics(tmp_path / "run") if "val_loss" in m] == [10]


def test_resume_without_checkpoint_starts_fresh(tmp_path, capsys):
    result = train(tiny_config(train={"max_steps": 5}), tmp_path / "new", resume=True)
    assert result.status == "done"
    assert "starting fresh" in capsys.readouterr().err
    # A run that crashed before its first checkpoint: resuming starts over with a clean log.
    cfg = tiny_config(train={"max_steps": 8, "log_every": 1, "checkpoint_every": 100})
    with nan_loss_at_step(4):
        assert train(cfg, tmp_path / "crashed", quiet=True).status == "nonfinite"
    assert train(cfg, tmp_path / "crashed", resume=True, quiet=True).status == "done"
    steps = [m["step"] for m in metrics(tmp_path / "crashed") if "train_loss" in m]
    assert steps == list(range(1, 9))


def test_schedule_warms_up_then_decays_to_min_lr():
    cfg = tiny_config(train={"max_steps": 100, "warmup_steps": 10, "lr": 1.0, "min_lr": 0.1}).train
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(99, cfg) == pytest.approx(0.1, abs=1e-3)
    values = [lr_at(s, cfg) for s in range(10, 100)]
    assert all(a >= b for a, b in itertools.pairwise(values))
    wsd = tiny_config(
        train={
            "max_steps": 100,
            "warmup_steps": 0,
            "schedule": "wsd",
            "lr": 1.0,
            "min_lr": 0.0,
            "decay_fraction": 0.2,
        }
    ).train
    assert lr_at(79, wsd) == 1.0 and lr_at(90, wsd) == pytest.approx(0.5)


def test_muon_orthogonalizes_and_trains(tmp_path):
    g = torch.randn(96, 32)
    singular = torch.linalg.svdvals(orthogonalize(g))
    assert singular.min() > 0.5 and singular.max() < 1.3  # pushed towards 1 from any spread
    stack = torch.randn(3, 32, 96)  # the batched form Muon uses: one iteration per shape
    batched = orthogonalize(stack)
    for i in range(3):
        torch.testing.assert_close(batched[i], orthogonalize(stack[i]), rtol=1e-4, atol=1e-5)
    bf16 = orthogonalize(stack, dtype=torch.bfloat16)
    torch.testing.assert_close(bf16, batched, rtol=0.1, atol=0.05)
    result = train(
        tiny_config(train={"optimizer": "muon", "max_steps": 30}), tmp_path / "r", quiet=True
    )
    assert result.status == "done"
    lines = [m["train_loss"] for m in metrics(tmp_path / "r") if "train_loss" in m]
    assert lines[-1] < lines[0] - 0.5
    # Muon takes the blocks' weight matrices; T5's bias table, a lookup table, stays with AdamW.
    model = TransformerLM(dataclasses.replace(tiny_config().model, vocab_size=40, position="t5"))
    muon = tiny_config(train={"optimizer": "muon"}).train
    kinds = {
        id(p): group["kind"]
        for group in build_optimizer(model, muon, torch.device("cpu")).param_groups
        for p in group["params"]
    }
    assert kinds[id(model.blocks[0].attn.position.table)] == "adamw"
    assert kinds[id(model.blocks[0].attn.qkv.weight)] == "muon"


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_lm_train_never_imports_dynamo_and_trains_and_resumes_the_same(tmp_path, optimizer):
    # torch._dynamo costs a second or two of every start; an lm train process builds, steps,
    # saves and reloads its optimizer without it, and trains what the library does.
    steps = {"optimizer": optimizer, "max_steps": 6, "checkpoint_every": 3}
    sections = {"data": {"cache_dir": str(tmp_path / "cache")}, "train": steps}
    path = write_config(tmp_path / "c.yaml", **sections)
    script = (
        "import sys\n"
        "from lm.cli import main\n"
        "out, cfg = sys.argv[1], sys.argv[2]\n"
        "assert main(['train', cfg, '--out', out, '--quiet', '--set', 'train.max_steps=3']) == 0\n"
        "assert main(['train', cfg, '--out', out, '--quiet', '--resume']) == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    cmd = [sys.executable, "-c", script, str(tmp_path / "cli"), str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
    train(tiny_config(**sections), tmp_path / "lib", quiet=True)
    assert_same_weights(tmp_path / "cli", tmp_path / "lib")


def test_compiled_model_matches_eager_loss_and_gradients():
    # The CPU path compiles with Inductor's C++ wrapper; same math as eager, to float tolerance.
    cfg = dataclasses.replace(tiny_config().model, vocab_size=40)
    torch.manual_seed(0)
    eager = TransformerLM(cfg)
    twin = TransformerLM(cfg)
    twin.load_state_dict(eager.state_dict())
    compiled = compile_model(twin, torch.device("cpu"))
    ids = torch.randint(0, cfg.vocab_size, (3, cfg.context_length + 1))
    loss = [loss_sum(model(ids[:, :-1]), ids[:, 1:]) for model in (eager, compiled)]
    torch.testing.assert_close(loss[1], loss[0], rtol=1e-5, atol=0)
    for x in loss:
        x.backward()
    for (name, a), b in zip(eager.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc malloc setting")
def test_freed_host_memory_is_reused_instead_of_faulted_in_again():
    # 40 MiB blocks: above the largest size glibc ever stops mapping afresh by itself, so without
    # the setting each of these allocations costs 10,240 page faults.
    code = (
        "import resource, torch\n"
        "from lm.runtime.host import retain_freed_host_memory\n"
        "assert retain_freed_host_memory()\n"
        "faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        # The heap grows past the small allocations between blocks for the first several
        # blocks; how many depends on what was imported before.
        "for _ in range(16):\n"
        "    torch.empty(10 << 20).fill_(1.0)\n"
        "before = faults()\n"
        "for _ in range(20):\n"
        "    torch.empty(10 << 20).fill_(1.0)\n"
        "print(faults() - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # Without it: 20 x 10,240. A block now and then still lands past a small allocation.
    assert int(out.stdout) < 3 * 10_240


def test_compiling_on_cpu_without_a_cpp_compiler_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no compiler anywhere
    monkeypatch.delenv("CXX", raising=False)
    model = TransformerLM(dataclasses.replace(tiny_config().model, vocab_size=40))
    with pytest.raises(ConfigError, match=r"train\.compile: .*C\+\+ compiler"):
        compile_model(model, torch.device("cpu"))


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_bf16_autocast_step_matches_fp32_within_bf16_precision(position):
    # The fast path on AMX CPUs and on GPUs: matmuls in bf16 (8-bit mantissa), the loss in fp32.
    cfg = dataclasses.replace(tiny_config().model, vocab_size=40, position=position)
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    ids = torch.randint(0, cfg.vocab_size, (4, cfg.context_length + 1))
    assert_bf16_step_matches_fp32(model, ids, torch.device("cpu"))


def test_resume_refuses_a_changed_model_naming_the_key(tmp_path):
    train(tiny_config(train={"max_steps": 2, "checkpoint_every": 2}), tmp_path / "run", quiet=True)
    with pytest.raises(ConfigError, match=r"model\.n_layer: the run was trained with 2"):
        train(tiny_config(model={"n_layer": 3}), tmp_path / "run", resume=True, quiet=True)


def test_flex_attention_trains_on_cpu_through_sdpa_masks_and_says_so_once(tmp_path, capsys):
    train_cfg = {"max_steps": 2, "eval_every": 2, "eval_steps": 1, "checkpoint_every": 2}
    cfg = tiny_config(model={"kernel": "flex"}, train=train_cfg)
    result = train(cfg, tmp_path / "run")
    assert result.status == "done"
    err = capsys.readouterr().err
    assert err.count("model.kernel: flex has no backward pass on cpu") == 1, err


def test_run_json_says_what_ran_and_threads_beyond_the_cores_are_cut(tmp_path, capsys):
    from lm.runtime.device import cpu_bf16_kind, resolve_dtype

    cores = len(os.sched_getaffinity(0))
    cfg = tiny_config(
        model={"position": "t5"}, train={"max_steps": 2, "dtype": "auto", "threads": 999}
    )
    train(cfg, tmp_path / "run")
    err = capsys.readouterr().err
    assert f"train.threads=999 is more than the {cores} cores" in err
    ran = json.loads((tmp_path / "run" / "run.json").read_text())["ran"]
    dtype = resolve_dtype("auto", torch.device("cpu"), cfg.model)
    assert dtype == torch.float32  # width 32: fp32 with SDPA on any CPU (lm.runtime.device)
    why = ran["dtype_choice"]["why"]
    assert ran == {
        "device": "cpu",
        "dtype": "float32",
        "kernel": "math",  # a learned bias trains through the notes' formula on CPU
        "threads": cores,
        "compile": False,
        # auto is decided by a rule of the CPU and the width, and says why
        "dtype_choice": {"value": "fp32", "how": "rule", "why": why},
        "kernel_choice": {"value": "sdpa", "how": "rule", "why": why},
    }
    assert why in (
        "no bf16 instructions on this CPU",
        f"bf16 instructions ({cpu_bf16_kind()}), width 32 < 128",
    )
    assert "dtype: auto" in (tmp_path / "run" / "config.yaml").read_text()  # as given
    resumed = tiny_config(model={"position": "t5"}, train={"max_steps": 4, "threads": 1})
    train(resumed, tmp_path / "run", resume=True, quiet=True)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["resumes"][-1]["ran"]["threads"] == 1


def test_a_padded_run_counts_its_target_tokens_exactly_and_a_resume_counts_the_same(tmp_path):
    """metrics.jsonl's ``tokens``: the real target tokens trained on since step 0 (padding
    not counted), carried through a checkpoint, so lm compare's "tokens seen" is exact for
    padded data too, and the same for the same command."""
    from lm.compare.measure import _tokens_seen
    from lm.data.batches import TrainBatches
    from lm.data.sources import prepare_data

    data = {"source": "builtin:copy", "mode": "padded", "task_lengths": "1-8",
            "task_eval_lengths": "1-8", "task_examples": 64, "task_eval_examples": 8,
            "cache_dir": str(tmp_path / "cache")}  # fmt: skip
    cfg = tiny_config(data=data, train={"max_steps": 24, "checkpoint_every": 8, "eval_every": 12})
    train(cfg, tmp_path / "straight", quiet=True)
    with nan_loss_at_step(13):  # a crash between checkpoints 8 and 16, then resumed from 8
        train(cfg, tmp_path / "resumed", quiet=True)
    assert train(cfg, tmp_path / "resumed", resume=True, quiet=True).status == "done"
    # Counted here from the batches themselves: each row's trained targets, padding not.
    prepared = prepare_data(cfg.data, log=None)
    batches = TrainBatches(prepared.train, cfg.data, 32, 8, 1, prepared.tokenizer.pad_id, 7)
    targets = [int(batches.step(s)[0][0]["loss_mask"].sum()) for s in range(24)]
    assert batches.padding_fraction > 0
    for run in ("straight", "resumed"):
        records = metrics(tmp_path / run)
        counted = {r["step"]: r["tokens"] for r in records if "tokens" in r}
        assert counted == {s: sum(targets[:s]) for s in (5, 10, 15, 20, 24)}, run
        assert _tokens_seen(cfg, 24, records) == (sum(targets), True)
