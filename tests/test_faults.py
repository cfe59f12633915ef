"""What happens when things go wrong: crashes, failed writes, NaNs, a second writer, memory."""

from __future__ import annotations

import errno
import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _support import Pauses, losses, metrics, nan_loss_at_step, tiny_config, write_config
from safetensors.torch import load_file

import lm.runs.checkpoint
from lm.runs.checkpoint import CHECKPOINTS, complete_checkpoints, latest_checkpoint
from lm.runs.directory import LOCK, RunLocked
from lm.runs.load import load_run
from lm.training.loop import train

KILL_TRAIN = {"max_steps": 48, "checkpoint_every": 4, "eval_every": 24, "log_every": 1}


def start(config: Path, run_dir: Path, *extra: str, env=None) -> subprocess.Popen:
    """``lm train`` in a subprocess (``env``: where it pauses, tests/_support.Pauses)."""
    cmd = [sys.executable, "-m", "lm", "train", str(config), "--out", str(run_dir), "--quiet"]
    return subprocess.Popen([*cmd, *extra], stderr=subprocess.PIPE, text=True, env=env)


def logged_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return -1
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]
    return max(steps, default=-1)


def writing(run_dir: Path) -> bool:
    root = run_dir / CHECKPOINTS
    return root.is_dir() and any(p.name.startswith(".tmp-") for p in root.iterdir())


def assert_same_run(a: Path, b: Path) -> None:
    assert losses(a) == losses(b)
    assert losses(a, "val_loss") == losses(b, "val_loss")
    wa = load_file(str(latest_checkpoint(a) / "model.safetensors"))
    wb = load_file(str(latest_checkpoint(b) / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run, as a subprocess like the runs it is compared with."""
    root = tmp_path_factory.mktemp("faults")
    config = write_config(
        root / "c.yaml", data={"cache_dir": str(root / "cache")}, train=KILL_TRAIN
    )
    proc = start(config, root / "reference")
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    return config, root / "reference"


def test_sigkill_at_random_steps_and_mid_checkpoint_then_resume_equals_uninterrupted(
    reference, tmp_path
):
    # Each process stops where it is to be killed (a step about to start, or a checkpoint with
    # its first file written and the rest not) and says so; it is killed only then.
    config, ref = reference
    run = tmp_path / "run"
    rng = random.Random(0)
    kills = {"step": 0, "checkpoint write": 0}
    started = False
    for attempt in range(8):
        mode = "checkpoint write" if attempt % 2 else "step"
        extra = ("--resume",) if started else ()
        target = logged_step(run) + rng.randint(1, 6)  # the step (0-based) it stops before
        rule = {"where": "write"} if attempt % 2 else {"where": "step", "at": target}
        pauses = Pauses(tmp_path, [{**rule, "tell": "{fifo}", "then": "forever"}])
        proc = start(config, run, *extra, env=pauses.env())
        started = True
        told = pauses.wait(1, ended=proc)
        pauses.close()
        if told is None:  # it finished before the kill point
            assert proc.returncode == 0, proc.stderr.read()
            break
        if mode == "checkpoint write":
            assert writing(run)  # the write is in progress: a folder not yet renamed
        else:
            assert logged_step(run) == target  # every step before it done, none after
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills[mode] += 1
        # After any kill: every logged line is whole, and the newest complete checkpoint loads.
        for line in (run / "metrics.jsonl").read_text().splitlines():
            json.loads(line)
        newest = latest_checkpoint(run)
        if newest is not None:
            load_run(run, newest)
    else:
        proc = start(config, run, "--resume")
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
    assert kills == {"step": 4, "checkpoint write": 4}, kills
    assert not writing(run)  # the half-written folders were cleaned up
    assert_same_run(run, ref)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_stop_signal_saves_a_checkpoint_and_resume_continues_the_same_run(
    reference, tmp_path, stop
):
    config, ref = reference
    run = tmp_path / "run"
    pauses = Pauses(tmp_path, [{"where": "step", "at": 6, "tell": "{fifo}", "then": "signal"}])
    proc = start(config, run, env=pauses.env())
    assert pauses.wait(1, ended=proc) is not None, proc.stderr.read()
    pauses.close()
    proc.send_signal(stop)  # as Ctrl-C or a scheduler would, while step 7 is under way
    assert proc.wait(timeout=60) == 130
    assert "checkpoint saved" in proc.stderr.read()
    stopped_at = int(latest_checkpoint(run).name.split("_")[1])
    assert 6 < stopped_at < KILL_TRAIN["max_steps"]
    proc = start(config, run, "--resume")
    assert proc.wait(timeout=300) == 0
    assert_same_run(run, ref)  # the losses and the weights, bit for bit


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        PermissionError(errno.EACCES, "Permission denied"),
    ],
    ids=["disk-full", "permission-denied"],
)
def test_a_failing_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch, error):
    real = lm.runs.checkpoint.save_file
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint's optimizer file
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(lm.runs.checkpoint, "save_file", flaky)
    cfg = tiny_config(train={"max_steps": 20, "checkpoint_every": 5, "eval_every": 20})
    result = train(cfg, tmp_path / "stop", quiet=True)
    assert result.status == "checkpoint_failed" and result.step == 10
    assert error.strerror in result.message and "step_00000010" in result.message
    assert "\n" not in result.message
    assert [p.name for p in complete_checkpoints(tmp_path / "stop")] == ["step_00000005"]
    assert not writing(tmp_path / "stop")
    assert load_run(tmp_path / "stop").step == 5
    assert metrics(tmp_path / "stop")[-1]["status"] == "checkpoint_failed"

    calls["n"] = 0
    cfg = tiny_config(
        train={"max_steps": 20, "checkpoint_every": 5, "on_checkpoint_error": "continue"}
    )
    result = train(cfg, tmp_path / "go-on", quiet=True)
    assert result.status == "done" and result.step == 20
    assert latest_checkpoint(tmp_path / "go-on").name == "step_00000020"


def test_nonfinite_loss_stops_at_its_step_keeping_the_last_good_checkpoint(tmp_path):
    cfg = tiny_config(train={"max_steps": 20, "checkpoint_every": 5})
    with nan_loss_at_step(7):  # 0-based: the 8th optimizer step
        result = train(cfg, tmp_path / "run", quiet=True)
    assert result.status == "nonfinite" and "step 8" in result.message
    assert latest_checkpoint(tmp_path / "run").name == "step_00000005"
    # The log's last line says why the run stopped.
    assert metrics(tmp_path / "run")[-1] == {
        "step": result.step, "elapsed_s": metrics(tmp_path / "run")[-1]["elapsed_s"],
        "status": "nonfinite", "message": result.message,
    }  # fmt: skip
    run = load_run(tmp_path / "run")
    assert all(torch.isfinite(p).all() for p in run.model.parameters())


def test_nonfinite_loss_can_be_skipped_and_is_counted(tmp_path):
    cfg = tiny_config(train={"max_steps": 20, "on_nonfinite": "skip", "log_every": 1})
    with nan_loss_at_step(7):
        result = train(cfg, tmp_path / "run", quiet=True)
    assert result.status == "done"
    by_step = {m["step"]: m for m in metrics(tmp_path / "run") if "nonfinite_skips" in m}
    assert by_step[7]["nonfinite_skips"] == 0 and by_step[8]["nonfinite_skips"] == 1
    assert by_step[20]["nonfinite_skips"] == 1
    # Step 8 was skipped: its interval has no loss and its gradient norm is not a number.
    assert by_step[8]["train_loss"] is None and by_step[8]["grad_norm"] is None
    assert by_step[9]["train_loss"] > 0 and by_step[9]["grad_norm"] > 0
    assert metrics(tmp_path / "run")[-1]["status"] == "done"
    run = load_run(tmp_path / "run")
    assert all(torch.isfinite(p).all() for p in run.model.parameters())


def test_one_writer_per_run_and_a_dead_writer_leaves_no_stuck_lock(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        (run / LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": sleeper.pid}))
        with pytest.raises(RunLocked, match=f"another process \\(pid {sleeper.pid}"):
            train(tiny_config(train={"max_steps": 3}), run, quiet=True)
    finally:
        sleeper.kill()
        sleeper.wait()
    result = train(tiny_config(train={"max_steps": 3}), run, resume=True, quiet=True)
    assert result.status == "done" and not (run / LOCK).exists()


def test_resident_memory_stays_flat_over_thousands_of_steps(tmp_path):
    cfg = tiny_config(
        model={"context_length": 8, "n_layer": 1, "n_head": 1, "d_model": 16},
        train={"max_steps": 2000, "batch_size": 2, "log_every": 250, "eval_every": 0,
               "checkpoint_every": 0, "warmup_steps": 0},
    )  # fmt: skip
    train(cfg, tmp_path / "run", quiet=True)
    rss = {m["step"]: m["rss_mb"] for m in metrics(tmp_path / "run") if "rss_mb" in m}
    warm = rss[500]
    assert max(v for s, v in rss.items() if s >= 500) - warm < 15.0, rss


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "bad",
    [
        ["data.source=/nonexistent/file.txt"],
        ["data.tokenizer=bpe", "data.vocab_size=5"],
        [
            "data.source=builtin:copy",
            "data.mode=padded",
            "data.task_examples=30",
            "data.task_lengths=1-8",
            "data.task_eval_lengths=1-8",
            "train.batch_size=32",
        ],
    ],
    ids=["missing-source", "bpe-vocab-too-small", "too-few-padded-sequences"],
)
def test_overwrite_deletes_nothing_when_the_new_run_is_refused(tmp_path, capsys, bad):
    from lm.cli import main

    config = write_config(tmp_path / "c.yaml", data={"cache_dir": str(tmp_path / "cache")})
    run = tmp_path / "run"
    assert main(["train", str(config), "--out", str(run), "--quiet"]) == 0
    before = _snapshot(run)
    assert any(name.startswith(CHECKPOINTS) for name in before)
    code = main(["train", str(config), "--out", str(run), "--overwrite", "--quiet", "--set", *bad])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("lm: error: "), err
    assert _snapshot(run) == before  # checkpoints, metrics, config.yaml and run.json as they were
    # A new run that passes its checks replaces the old one, its earlier event files included.
    assert main(["train", str(config), "--out", str(run), "--overwrite", "--quiet"]) == 0
    assert len(list(run.glob("events.out.tfevents.*"))) <= 1
