"""Batches and processes at scale: micro-batches, evaluation memory, the chunked loss, a step
that never waits on the device, and faults on one process of many stopping all of them."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from _support import assert_one_line, losses, metrics, tiny_config, write_config
from torch.utils._python_dispatch import TorchDispatchMode

import lm.runs.load
import lm.runtime.distributed
import lm.training.loop
import lm.training.step
from lm.config.errors import ConfigError
from lm.data.batches import TrainBatches
from lm.model.transformer import TransformerLM, loss_sum
from lm.runs.checkpoint import latest_checkpoint
from lm.training.loop import train
from lm.training.optim import build_optimizer, step_unless_nonfinite

FAULT_LAUNCHER = Path(__file__).parent / "fault_launcher.py"


def test_micro_batch_size_sets_the_accumulation_and_numbers_that_do_not_divide_say_so():
    tc = tiny_config(train={"batch_size": 32, "micro_batch_size": 4}).train
    assert [tc.accumulation(n) for n in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert tc.eval_batch() == 4
    with pytest.raises(ConfigError) as e:
        tc.accumulation(3)
    assert_one_line(e, "batch_size", "32", "micro_batch_size", "4", "3 process")
    with pytest.raises(ConfigError) as e:
        tiny_config(train={"batch_size": 10, "micro_batch_size": 4})
    assert_one_line(e, "batch_size", "10", "micro_batch_size", "4", "1 process")
    with pytest.raises(ConfigError) as e:
        tiny_config(train={"micro_batch_size": 4, "grad_accum": 2})
    assert_one_line(e, "micro_batch_size", "grad_accum")
    # Without micro_batch_size, grad_accum keeps its meaning: micro-batches on each process.
    old = tiny_config(train={"batch_size": 32, "grad_accum": 2}).train
    assert [old.micro_batch(n) for n in (1, 2)] == [16, 8] and old.eval_batch() == 16


def test_micro_batches_train_the_same_curve_as_grad_accum(tmp_path):
    common = {"max_steps": 6, "eval_every": 6, "log_every": 1, "batch_size": 8}
    train(tiny_config(train={**common, "grad_accum": 2}), tmp_path / "accum", quiet=True)
    train(tiny_config(train={**common, "micro_batch_size": 4}), tmp_path / "micro", quiet=True)
    assert losses(tmp_path / "micro") == losses(tmp_path / "accum")
    assert losses(tmp_path / "micro", "val_loss") == losses(tmp_path / "accum", "val_loss")


def test_evaluation_memory_does_not_grow_with_batch_size(tmp_path):
    """GPT-2's shape where it matters for memory (context 1024, the head over the vocabulary),
    small elsewhere: the largest tensor any operation of an evaluation produces is at most a
    micro-batch's widest activation (logits, or the MLP's hidden layer), whatever batch_size
    says."""
    model = {"context_length": 1024, "n_layer": 1, "n_head": 2, "d_model": 32}
    real_evaluate = lm.training.loop.evaluate
    largest: list[int] = []

    def spied_evaluate(*args, **kwargs):
        with _LargestFloat32() as spy:
            result = real_evaluate(*args, **kwargs)
        largest.append(spy.largest)
        return result

    peaks = {}
    for batch_size in (4, 64):
        largest.clear()
        cfg = tiny_config(
            model=model,
            train={"batch_size": batch_size, "micro_batch_size": 2, "max_steps": 1,
                   "warmup_steps": 0, "eval_every": 1, "eval_steps": 3},
        )  # fmt: skip
        with mock.patch.object(lm.training.loop, "evaluate", spied_evaluate):
            train(cfg, tmp_path / f"b{batch_size}", quiet=True)
        vocab = lm.runs.load.load_run(tmp_path / f"b{batch_size}").config.model.vocab_size
        assert largest, "no evaluation ran"
        peaks[batch_size] = max(largest)
        assert 0 < peaks[batch_size] <= 2 * 1024 * max(vocab, 4 * 32)
    assert peaks[64] == peaks[4]


class _LargestFloat32(TorchDispatchMode):
    """Records the largest fp32 tensor any operation produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


def test_chunked_loss_equals_the_one_call_loss_without_a_full_fp32_copy():
    torch.manual_seed(0)
    logits = torch.randn(4, 50, 97, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 97, (4, 50))
    mask = torch.rand(4, 50) > 0.2
    whole = loss_sum(logits, targets, mask)
    (whole_grad,) = torch.autograd.grad(whole, logits)
    chunk = 16 * 97  # 16 rows of 200 at a time
    with _LargestFloat32() as spy:
        chunked = loss_sum(logits, targets, mask, chunk_elements=chunk)
        (chunked_grad,) = torch.autograd.grad(chunked, logits)
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=0)
    torch.testing.assert_close(chunked_grad, whole_grad, rtol=0, atol=0)
    assert spy.largest <= chunk < logits.numel()
    with torch.no_grad(), _LargestFloat32() as spy:
        assert loss_sum(logits, targets, mask, chunk_elements=chunk) == chunked.detach()
    assert spy.largest <= chunk


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_skipped_step_leaves_parameters_and_optimizer_state_exactly(optimizer):
    torch.manual_seed(0)
    cfg = tiny_config(train={"optimizer": optimizer})
    model = TransformerLM(dataclasses.replace(cfg.model, vocab_size=40))
    opt = build_optimizer(model, cfg.train, torch.device("cpu"))
    ids = torch.randint(0, 40, (2, 16))

    def grads(poison: bool) -> None:
        loss = model(ids).float().logsumexp(-1).mean()
        (loss * float("nan") if poison else loss).backward()

    grads(False)
    step_unless_nonfinite(opt, torch.tensor(True))  # a real step: the state exists
    opt.zero_grad()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = [{k: v.clone() for k, v in s.items()} for s in opt.state.values()]
    grads(True)
    step_unless_nonfinite(opt, torch.tensor(False))
    for n, p in model.named_parameters():
        assert torch.equal(p, params[n]), n
    for before, after in zip(state, opt.state.values(), strict=True):
        assert before.keys() == after.keys()
        for k in before:
            assert torch.equal(before[k], after[k]), k
    opt.zero_grad()
    grads(False)
    step_unless_nonfinite(opt, torch.tensor(True))  # and a finite step still moves them
    assert any(not torch.equal(p, params[n]) for n, p in model.named_parameters())


_SYNCS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy")


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_no_host_sync_in_a_training_step_between_log_steps(tmp_path, optimizer):
    """Every read of a tensor's value on the host is counted by the step it happens in (the
    batch building and the look at the host batch before its copy to the device, host data by
    nature, aside); steps that neither log, evaluate nor save must have none."""
    current = {"step": -1, "in_batches": False}
    syncs: dict[int, int] = {}
    batches_of, inputs_of = TrainBatches.step, lm.training.step.model_inputs

    def host_side(function):
        def run(*args):
            current["in_batches"] = True
            try:
                return function(*args)
            finally:
                current["in_batches"] = False

        return run

    def step(self, i):
        current["step"] = i
        return host_side(batches_of)(self, i)

    def counting(name):
        real = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if not current["in_batches"] and current["step"] >= 0:
                syncs[current["step"]] = syncs.get(current["step"], 0) + 1
            return real(self, *args, **kwargs)

        return read

    cfg = tiny_config(
        train={"max_steps": 20, "log_every": 10, "eval_every": 0, "checkpoint_every": 0,
               "optimizer": optimizer, "on_nonfinite": "skip"},
    )  # fmt: skip
    patches = [mock.patch.object(torch.Tensor, n, counting(n)) for n in _SYNCS]
    with (
        mock.patch.object(TrainBatches, "step", step),
        mock.patch.object(lm.training.step, "model_inputs", host_side(inputs_of)),
    ):
        for p in patches:
            p.start()
        try:
            result = train(cfg, tmp_path / "run", quiet=True)
        finally:
            for p in patches:
                p.stop()
    assert result.status == "done"
    quiet_steps = {s: n for s, n in syncs.items() if s not in (9, 19)}  # steps 10 and 20 log
    assert not quiet_steps, f"host syncs in steps that neither log, evaluate nor save: {syncs}"
    assert syncs.get(9), "the counting saw no read at a log step: it counts nothing"


def test_nonfinite_stop_before_any_checkpoint_does_not_promise_one(tmp_path):
    from _support import nan_loss_at_step

    cfg = tiny_config(train={"max_steps": 10, "log_every": 5, "checkpoint_every": 100})
    with nan_loss_at_step(2):
        result = train(cfg, tmp_path / "run", quiet=True)
    assert result.status == "nonfinite" and "step 3" in result.message
    assert "checkpoint is kept" not in result.message and "no checkpoint" in result.message
    assert latest_checkpoint(tmp_path / "run") is None
    assert [m["step"] for m in metrics(tmp_path / "run") if "train_loss" in m] == []


def test_dist_timeout_reaches_init_process_group(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(lm.runtime.distributed.dist, "is_initialized", lambda: False)
    with mock.patch.object(lm.runtime.distributed.dist, "init_process_group") as init:
        world = lm.runtime.distributed.init_world("cpu", 1234.5)
    assert world.size == 2
    assert init.call_args.kwargs["timeout"].total_seconds() == 1234.5
    assert tiny_config().train.dist_timeout_s >= 3600


def _torchrun(fault: str, config: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    done = run_dir.parent / "rank0-done.fifo"  # rank 1 exits only once rank 0 has said its line
    os.mkfifo(done)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LM_TEST_RANK0_DONE": str(done)}
    cmd = [
        # (torchrun ends the others 3 s after one process fails: time to print their lines)
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "--monitor-interval=3",
        str(FAULT_LAUNCHER), fault, "train", str(config), "--out", str(run_dir), "--quiet", *extra,
    ]  # fmt: skip
    # A process left waiting for the other in a collective would hang: the timeout fails it.
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


def _stop_lines(err: str) -> list[str]:
    """The lines the processes printed with ``lm: ``; two processes' lines may interleave on
    the shared pipe, so split at every ``lm: `` wherever it stands."""
    text = "\n".join(line for line in err.splitlines() if "lm: " in line)
    return ["lm: " + part.strip() for part in text.split("lm: ")[1:]]


@pytest.fixture
def two_process_config(tmp_path):
    train_cfg = {"max_steps": 8, "checkpoint_every": 4, "eval_every": 8, "log_every": 2}
    return write_config(
        tmp_path / "c.yaml", data={"cache_dir": str(tmp_path / "cache")}, train=train_cfg
    )


def test_a_checkpoint_write_failing_on_rank_0_stops_both_ranks(tmp_path, two_process_config):
    out = _torchrun("write-fails-on-rank0", two_process_config, tmp_path / "run")
    assert out.returncode != 0
    lines = _stop_lines(out.stderr)
    assert len(lines) == 1, out.stderr[-3000:]  # said once, by rank 0
    assert "rank 0" in lines[0] and ("step_00000004" in lines[0] or "step 4" in lines[0])
    assert "No space left" in lines[0], lines
    assert latest_checkpoint(tmp_path / "run") is None


def test_a_signal_on_rank_1_stops_both_ranks_with_a_checkpoint(tmp_path, two_process_config):
    out = _torchrun("signal-on-rank1", two_process_config, tmp_path / "run")
    lines = _stop_lines(out.stderr)
    assert len(lines) == 1, out.stderr[-3000:]  # said once, by rank 0
    assert "signal on rank 1 at step 4" in lines[0], lines
    assert latest_checkpoint(tmp_path / "run").name == "step_00000004"


def test_resume_stops_when_a_rank_lacks_the_checkpoint(tmp_path, two_process_config):
    cfg = {"max_steps": 4, "checkpoint_every": 4, "eval_every": 4, "log_every": 2}
    train(tiny_config(data={"cache_dir": str(tmp_path / "cache")}, train=cfg), tmp_path / "run",
          quiet=True)  # fmt: skip
    out = _torchrun("no-checkpoint-on-rank1", two_process_config, tmp_path / "run", "--resume")
    # Each process refuses as the CLI refuses bad input (status 2); torchrun reports it as 1.
    # Rank 0 exits first (rank 1 waits for it), and torchrun may end rank 1 soon after: at least
    # one status 2, and no hang (the timeout).
    assert out.returncode != 0 and out.stderr.count("exitcode  : 2") >= 1, out.stderr[-3000:]
    lines = _stop_lines(out.stderr)
    assert len(lines) == 1, out.stderr[-3000:]  # said once, by rank 0
    assert "rank 1" in lines[0] and "no checkpoint" in lines[0] and "shared filesystem" in lines[0]
    assert latest_checkpoint(tmp_path / "run").name == "step_00000004"
