"""Several processes (2 on CPU, Gloo): FSDP2 and DDP train as one process does, and a sharded
run's checkpoints are a one-process run's checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _support import assert_one_line, expect_error, losses, tiny_config, write_config
from safetensors import safe_open
from safetensors.torch import load_file

from lm.cli import main
from lm.config.errors import ConfigError
from lm.data.batches import eval_batches
from lm.data.sources import prepare_data
from lm.runs.checkpoint import latest_checkpoint
from lm.runs.load import load_run
from lm.training.loop import train

# Several micro-batches a step (FSDP's gradient sync skipped on all but the last) and a clip
# that bites (the tiny model's gradient norm is above 0.5 from the start).
# An odd number of evaluation batches: the processes must still run as many forwards each.
STEPS = {"eval_every": 6, "eval_steps": 3, "log_every": 1, "batch_size": 8, "grad_accum": 2,
         "grad_clip": 0.5}  # fmt: skip


# The schemes of 2023-25 with SSMax, p-RoPE and a sliding window, one per layer: what FSDP shards
# and DDP reduces includes FoX's gates, CoPE's table and SSMax's scales.
NEWER = {
    "n_layer": 4,
    "position": ["fox", "cope", "xpos", "sandwich"],
    "rope_p": 0.5,
    "normalize": "ssmax",
    "window": [8, None, "..."],
}


def torchrun(config: Path, out: Path, *flags: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "lm", "train", str(config), "--out", str(out), "--quiet", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def checkpoint_files(run_dir: Path) -> tuple[dict, dict, dict]:
    ckpt = latest_checkpoint(run_dir)
    state = json.loads((ckpt / "state.json").read_text())
    return (
        load_file(str(ckpt / "model.safetensors")),
        load_file(str(ckpt / "optimizer.safetensors")),
        state,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory, block) -> Path:
    """One process, and 2-process FSDP, 6 steps each, checkpoints at 3 and 6, in each block."""
    root = tmp_path_factory.mktemp("parallel")
    data = {"cache_dir": str(root / "cache")}  # its own (the per-test LM_CACHE is not set yet)
    model = {**NEWER, **block}
    cfg = {"model": model, "train": {**STEPS, "max_steps": 6, "checkpoint_every": 3}}
    train(tiny_config(data=data, **cfg), root / "one", quiet=True)
    fsdp = {"model": model, "train": {**cfg["train"], "parallel": "fsdp"}}
    torchrun(write_config(root / "fsdp.yaml", data=data, **fsdp), root / "fsdp")
    return root


def test_two_process_fsdp_matches_one_process(runs):
    one, two = losses(runs / "one"), losses(runs / "fsdp")
    assert one.keys() == two.keys() == set(range(1, 7))
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5)
    assert losses(runs / "fsdp", "val_loss")[6] == pytest.approx(
        losses(runs / "one", "val_loss")[6], rel=1e-5
    )
    norms = [m["grad_norm"] for m in map(json.loads, (runs / "fsdp/metrics.jsonl").open())
             if "grad_norm" in m]  # fmt: skip
    assert len(norms) == 6 and all(n > 0.5 for n in norms)  # the clip was applied every step


def test_fsdp_in_bf16_matches_one_process_autocast_and_keeps_fp32_weights(tmp_path):
    # FSDP's mixed precision (bf16 weights in the forward) against one process's bf16 autocast.
    cfg = {"train": {**STEPS, "max_steps": 4, "checkpoint_every": 4, "dtype": "bf16"}}
    train(tiny_config(**cfg), tmp_path / "one", quiet=True)
    fsdp = {"train": {**cfg["train"], "parallel": "fsdp"}}
    torchrun(write_config(tmp_path / "fsdp.yaml", **fsdp), tmp_path / "fsdp")
    one, two = losses(tmp_path / "one"), losses(tmp_path / "fsdp")
    assert one.keys() == two.keys() == set(range(1, 5))
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=2e-3)
    weights, optimizer, _ = checkpoint_files(tmp_path / "fsdp")
    assert {t.dtype for t in [*weights.values(), *optimizer.values()]} == {torch.float32}


def test_fsdp_checkpoint_is_a_one_process_checkpoint(runs):
    w1, o1, s1 = checkpoint_files(runs / "one")
    w2, o2, s2 = checkpoint_files(runs / "fsdp")
    assert w1.keys() == w2.keys() and o1.keys() == o2.keys()  # tied head stored once in both
    for k in w1:
        assert w2[k].shape == w1[k].shape and w2[k].dtype == w1[k].dtype
        # Equal up to the order of FSDP's sums: Adam divides each step by the gradient's own
        # size, so a weight whose gradient is near zero can move by a few 1e-5 either way
        # (one of 4096 did on an AMD EPYC). A misplaced shard differs by the weights' 1e-2.
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-4)
    for k in o1:
        assert o2[k].shape == o1[k].shape, k
    assert s2["optimizer"] == s1["optimizer"]
    ckpt = latest_checkpoint(runs / "fsdp") / "model.safetensors"
    with safe_open(str(ckpt), "pt") as f:
        assert f.metadata() == {"head.weight": "embed.weight"}
    # A plain one-process load (what lm sample, eval and export use) takes it unchanged.
    loaded = load_run(runs / "fsdp")
    head = loaded.model.head.weight
    assert head is loaded.model.embed.weight
    torch.testing.assert_close(head.detach(), w2["embed.weight"], rtol=0, atol=0)


def test_fsdp_resume_equals_an_uninterrupted_fsdp_run(runs, block, tmp_path, capsys):
    # Stopped after 3 steps (all in warmup, so the schedule is the 6-step run's), then resumed.
    first = {
        "model": {**NEWER, **block},
        "train": {**STEPS, "max_steps": 3, "checkpoint_every": 3, "parallel": "fsdp"},
    }
    torchrun(write_config(tmp_path / "three.yaml", **first), tmp_path / "resumed")
    shutil.copytree(tmp_path / "resumed", tmp_path / "resumed_by_one")
    rest = {"model": first["model"], "train": {**first["train"], "max_steps": 6}}
    torchrun(write_config(tmp_path / "six.yaml", **rest), tmp_path / "resumed", "--resume")
    assert losses(tmp_path / "resumed") == losses(runs / "fsdp")
    w_straight, o_straight, _ = checkpoint_files(runs / "fsdp")
    w_resumed, o_resumed, _ = checkpoint_files(tmp_path / "resumed")
    for straight, resumed in ((w_straight, w_resumed), (o_straight, o_resumed)):
        assert straight.keys() == resumed.keys()
        for k in straight:
            torch.testing.assert_close(resumed[k], straight[k], rtol=0, atol=0, msg=k)
    # The same checkpoint resumed by one process goes on along the same curve, and says that it
    # continues to float rounding, not bit for bit.
    capsys.readouterr()
    argv = ["train", str(tmp_path / "six.yaml"), "--out", str(tmp_path / "resumed_by_one")]
    assert main([*argv, "--resume"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "process" in line]
    assert [n for n in notes if "note" in n] == [
        f"lm: note: {tmp_path / 'resumed_by_one'} trained on 2 processes and resumes on 1: "
        "every step trains on the same global batch, split otherwise, so the losses match an "
        "uninterrupted run to float rounding, not bit for bit (with dropout, less: its random "
        "masks differ)"
    ], notes
    by_one, straight = losses(tmp_path / "resumed_by_one"), losses(runs / "fsdp")
    assert by_one.keys() == straight.keys()
    for step in straight:
        assert by_one[step] == pytest.approx(straight[step], rel=1e-5)


def test_ddp_trains_one_processs_weights_and_resumes_bit_for_bit(runs, block, tmp_path):
    # DDP (train.parallel's default) for 6 steps against one process, then stopped after 3 steps
    # (all in warmup, so the schedule is the 6-step run's) and resumed by DDP.
    data = {"cache_dir": str(runs / "cache")}
    six = {"model": {**NEWER, **block}, "train": {**STEPS, "max_steps": 6, "checkpoint_every": 3}}
    torchrun(write_config(tmp_path / "six.yaml", data=data, **six), tmp_path / "straight")
    one, straight = losses(runs / "one"), losses(tmp_path / "straight")
    assert one.keys() == straight.keys() == set(range(1, 7))
    for step in one:
        assert straight[step] == pytest.approx(one[step], rel=1e-5)
    w_one, _, _ = checkpoint_files(runs / "one")
    w_straight, o_straight, _ = checkpoint_files(tmp_path / "straight")
    assert w_one.keys() == w_straight.keys()
    for k in w_one:  # up to the order of the gradient's sums, as FSDP's above
        torch.testing.assert_close(w_straight[k], w_one[k], rtol=1e-4, atol=1e-4, msg=k)
    three = {"model": six["model"], "train": {**six["train"], "max_steps": 3}}
    torchrun(write_config(tmp_path / "three.yaml", data=data, **three), tmp_path / "resumed")
    torchrun(tmp_path / "six.yaml", tmp_path / "resumed", "--resume")
    assert losses(tmp_path / "resumed") == straight
    # (the 3-step run also evaluated at its end, step 3)
    assert (
        losses(tmp_path / "resumed", "val_loss")[6] == losses(tmp_path / "straight", "val_loss")[6]
    )
    w_resumed, o_resumed, _ = checkpoint_files(tmp_path / "resumed")
    for whole, resumed in ((w_straight, w_resumed), (o_straight, o_resumed)):
        assert whole.keys() == resumed.keys()
        for k in whole:
            torch.testing.assert_close(resumed[k], whole[k], rtol=0, atol=0, msg=k)


def test_every_process_runs_as_many_evaluation_forwards():
    split = prepare_data(tiny_config().data).val
    data = tiny_config().data
    for n_batches in (1, 3, 4):
        ranks = [list(eval_batches(split, data, 32, 2, 0, n_batches, r, 2)) for r in (0, 1)]
        assert len(ranks[0]) == len(ranks[1]) == -(-n_batches // 2)
        one = list(eval_batches(split, data, 32, 2, 0, n_batches))
        real = [b["targets"][b["loss_mask"]] for b in ranks[0] + ranks[1]]
        assert sum(len(t) for t in real) == sum(int(b["loss_mask"].sum()) for b in one)


def test_fsdp_with_muon_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        tiny_config(train={"parallel": "fsdp", "optimizer": "muon"})
    assert_one_line(e, "muon", "fsdp")
    with pytest.raises(ConfigError) as e:
        tiny_config(train={"parallel": "zero3"})
    assert_one_line(e, "train.parallel")


def test_fsdp_with_fp16_is_refused_alike_in_one_process_and_under_torchrun(tmp_path, capsys):
    """Once it trained silently in one process and was refused under torchrun, the line printed
    by both processes glued together. Now: refused at load in both, said once."""
    with pytest.raises(ConfigError) as e:
        tiny_config(train={"parallel": "fsdp", "dtype": "fp16"})
    assert_one_line(e, "fp16", "fsdp", "bf16")
    cfg = write_config(tmp_path / "c.yaml", train={"parallel": "fsdp", "dtype": "fp16"})
    expect_error(capsys, ["train", str(cfg), "--out", str(tmp_path / "one")], "fp16", "fsdp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "lm", "train", str(cfg), "--out", str(tmp_path / "two"), "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if "lm: " in line]
    assert len(lines) == 1 and done.stderr.count("lm: ") == 1, done.stderr[-3000:]
    assert lines[0].startswith("lm: error: train.dtype: fp16"), lines
    assert not (tmp_path / "one").exists() and not (tmp_path / "two").exists()
