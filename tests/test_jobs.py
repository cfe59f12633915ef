"""``lm compare --jobs N``: runs of a sweep trained side by side, in processes of their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import yaml
from _support import Pauses, assert_same_weights, losses, write_config

from lm.cli import main
from lm.compare.jobs import Job, job_threads
from lm.compare.measure import MEASURED
from lm.config.errors import LMError
from lm.runs.checkpoint import latest_checkpoint

SCHEMES = ("rope", "alibi", "learned")
CORES = 2  # what the two sweeps divide or use whole, whatever the test worker's own threads


def _argv(cfg, out, cache, *extra):
    return [
        "compare",
        str(cfg),
        "--vary",
        f"model.position={','.join(SCHEMES)}",
        "--set",
        f"data.cache_dir={cache}",
        *extra,
        "--out",
        str(out),
        "--max-new-tokens",
        "4",
        "--eval-lengths",
        "1x",
        "--quiet",
    ]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """The same sweep with two jobs at once and one run at a time on every core. The model is
    wide enough that PyTorch's kernels split their sums between threads."""
    root = tmp_path_factory.mktemp("jobs")
    cfg = write_config(
        root / "tiny.yaml",
        model={"context_length": 64, "d_model": 64},
        train={"max_steps": 12, "eval_every": 6, "checkpoint_every": 6},
    )
    before = torch.get_num_threads()
    torch.set_num_threads(CORES)
    try:
        assert main(_argv(cfg, root / "jobs", root / "cache", "--jobs", "2")) == 0
        assert main(_argv(cfg, root / "one", root / "cache")) == 0
    finally:
        torch.set_num_threads(before)
    return root, cfg


def test_two_jobs_train_every_run_as_one_at_a_time_does(sweeps):
    root, cores = sweeps[0], CORES
    for i, scheme in enumerate(SCHEMES):
        together, alone = (root / out / f"position={scheme}" / "seed7" for out in ("jobs", "one"))
        assert latest_checkpoint(together).name == "step_00000012"
        threads = yaml.safe_load((together / "config.yaml").read_text())["train"]["threads"]
        if i < 2:
            assert threads == max(1, cores // 2)  # the cores, divided between the jobs
        else:
            # The last: in lm compare's own process (None) when the first two end within one
            # look at the jobs, else in a job beside the one still training (a busy machine).
            assert threads in (None, max(1, cores // 2))
        assert yaml.safe_load((alone / "config.yaml").read_text())["train"]["threads"] is None
        for key in ("train_loss", "val_loss"):
            assert losses(together, key) == losses(alone, key) != {}
        assert_same_weights(together, alone)
    # The threads differ between runs but are not what they compare.
    title = (root / "jobs" / "report.md").read_text().splitlines()[0]
    assert title == "# Runs compared by position"


def test_the_last_jobs_take_the_cores_the_others_leave(tmp_path):
    def running(threads, step, max_steps=100):
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run.mkdir()
        (run / "metrics.jsonl").write_text(json.dumps({"step": step, "train_loss": 1.0}) + "\n")
        return SimpleNamespace(threads=threads, job=Job(run, [], max_steps))

    assert job_threads(8, 2, 5, []) == 4  # a full round: the cores divided by the jobs
    assert job_threads(8, 2, 5, [running(4, 10)]) == 4
    assert job_threads(8, 2, 1, []) == 8  # the last alone: every core
    assert job_threads(8, 2, 1, [running(4, 95)]) is None  # waits for the nearly done run's
    assert job_threads(8, 2, 1, [running(4, 50)]) == 4  # far from done: starts on what is free
    assert job_threads(16, 4, 2, [running(4, 95), running(4, 50)]) == 8  # free: 8, its share
    assert job_threads(2, 3, 5, [running(1, 10), running(1, 10)]) == 1  # more jobs than cores


JOB = "__main__.py train "  # in a job's command line (python -m lm train ...), not lm compare's


def test_ctrl_c_stops_every_job_with_a_checkpoint_and_the_same_command_resumes(sweeps, tmp_path):
    root, cfg = sweeps
    argv = _argv(cfg, tmp_path / "stopped", root / "cache", "train.max_steps=12", "--jobs", "2")
    command = [sys.executable, "-m", "lm", *[a for a in argv if a != "--quiet"]]
    # Each job stops before its third step and says so; Ctrl-C comes once both have.
    pauses = Pauses(
        tmp_path, [{"where": "step", "at": 2, "tell": "{fifo}", "then": "signal", "only": JOB}]
    )
    process = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, start_new_session=True, env=pauses.env()
    )
    first = [tmp_path / "stopped" / f"position={s}" / "seed7" for s in SCHEMES[:2]]
    told = pauses.wait(2, ended=process)
    assert told is not None, process.stderr.read()
    pauses.close()
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    _, err = process.communicate(timeout=300)
    assert process.returncode == 130, err
    last = err.strip().splitlines()[-1]
    saved = [f"position={s}/seed7 saved step {latest_checkpoint(r).name[-8:].lstrip('0')}"
             for s, r in zip(SCHEMES[:2], first, strict=True)]  # fmt: skip
    assert last == (
        f"lm: interrupted; stopped: {saved[0]}, {saved[1]}, position={SCHEMES[2]}/seed7 had "
        "not started; the same command again resumes"
    ), err
    assert "Traceback" not in err, err
    for run in first:
        assert 2 < int(latest_checkpoint(run).name.removeprefix("step_")) < 12
    assert not (tmp_path / "stopped" / f"position={SCHEMES[2]}").exists()  # never started
    assert main([*argv, "--quiet"]) == 0  # the same command: resumes both, trains the third
    for scheme in SCHEMES:
        resumed = tmp_path / "stopped" / f"position={scheme}" / "seed7"
        whole = root / "jobs" / f"position={scheme}" / "seed7"
        assert losses(resumed) == losses(whole)
        assert_same_weights(resumed, whole)


def test_a_job_that_fails_stops_the_others_with_a_checkpoint_and_says_which(
    sweeps, capsys, tmp_path, monkeypatch
):
    root, cfg = sweeps
    out = tmp_path / "failing"
    argv = _argv(cfg, out, root / "cache", "--jobs", "2")
    # The second diverges at once and hears of it at its first log, but starts only once the
    # first has reached its third step and said so: the first is training when told to stop,
    # and saves a checkpoint (a job told before its loop began would have none to save).
    pauses = Pauses(
        tmp_path,
        [
            {"where": "step", "at": 2, "tell": "ready", "then": "signal", "only": "lr=3e-3"},
            {"where": "step", "at": 0, "wait_for": "ready", "only": "lr=1e30"},
        ],
    )
    for key, value in pauses.env().items():
        monkeypatch.setenv(key, value)  # for the jobs this process starts
    argv[argv.index("--vary") + 1] = "train.lr=3e-3,1e30"
    argv[argv.index("--set") + 1 : argv.index("--set") + 1] = ["train.max_steps=400"]
    assert main(argv) == 2
    pauses.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lr=1e30" in err[0] and "non-finite" in err[0], err
    healthy = out / "lr=3e-3" / "seed7"
    step = int(latest_checkpoint(healthy).name.removeprefix("step_"))
    assert 2 < step < 400  # stopped early, with a checkpoint to resume from


def test_each_job_measures_its_run_and_the_report_equals_one_measured_alone(sweeps):
    """The jobs measure their runs for the report as soon as each is trained, on the job's own
    threads; the report reads those back, and its numbers are the ones measured in one process
    on every core."""
    root = sweeps[0]
    for scheme in SCHEMES:
        job = root / "jobs" / f"position={scheme}" / "seed7"
        trained_on = yaml.safe_load((job / "config.yaml").read_text())["train"]["threads"]
        # A job that another's end gave more cores (a busy machine: it started beside a run
        # far from done) trained its last steps, and is measured, on those: metrics.jsonl says
        # how many from the next logged step.
        logged = [r["threads"] for r in map(json.loads, (job / "metrics.jsonl").read_text(
            ).splitlines()) if "threads" in r]  # fmt: skip
        # In its job, on the threads it last trained on; by the report, on every core (as the
        # last run, which trained in the report's process).
        trained_on = (logged[-1] if logged else trained_on) or CORES
        one = root / "one" / job.relative_to(root / "jobs")
        for run, threads in ((job, trained_on), (one, CORES)):
            [entry] = json.loads((run / MEASURED).read_text())["entries"]
            assert entry["measured"]["threads"] == threads
    together, alone = (
        {r["label"]: r for r in json.loads((root / out / "report.json").read_text())["runs"]}
        for out in ("jobs", "one")
    )
    assert together.keys() == alone.keys() == set(SCHEMES)
    for label, run in together.items():
        for key in ("extrapolation", "continuation", "accuracy", "parameters", "step"):
            assert run[key] == alone[label][key], (label, key)
        assert run["extrapolation"][0]["loss"] is not None


def test_a_job_worker_trains_one_run_after_another_as_lm_train_would(tmp_path, monkeypatch):
    import lm.compare.jobs as jobs_module

    cfg = write_config(
        tmp_path / "tiny.yaml",
        data={"cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 4, "eval_every": 0, "checkpoint_every": 0},
    )
    workers = []

    class Counted(jobs_module._Worker):
        def __init__(self, *args):
            super().__init__(*args)
            workers.append(self)

    monkeypatch.setattr(jobs_module, "_Worker", Counted)
    runs = [tmp_path / f"seed{seed}" for seed in (1, 2, 3)]
    queue = [
        Job(run, [str(cfg), "--out", str(run), "--overwrite", "--set", f"train.seed={seed}"], 4)
        for seed, run in enumerate(runs, 1)
    ]
    jobs_module.run_jobs(queue, 2, 0, lambda line: None, cores=2)
    assert len(workers) == 2  # three runs in two workers: one of them trained two
    for job in queue:
        argv = json.loads((job.run_dir / "run.json").read_text())["argv"]
        assert argv[0].endswith(os.path.join("lm", "__main__.py"))
        assert argv[1:4] == ["train", *job.args[:2]] and "--quiet" in argv
    # The run a worker trained second is the run lm train makes alone.
    assert main(["train", str(cfg), "--out", str(tmp_path / "alone"), "--quiet",
                 "--set", "train.seed=3"]) == 0  # fmt: skip
    assert_same_weights(runs[2], tmp_path / "alone")
    # A refused run: its one line, from the worker's own part of standard error.
    bad = Job(
        tmp_path / "bad", [str(cfg), "--out", str(tmp_path / "bad"), "--set", "train.stpes=3"], 3
    )
    with pytest.raises(LMError, match=r"bad: .*train\.stpes"):
        jobs_module.run_jobs([bad], 1, 0, lambda line: None, cores=2)


def test_a_run_left_training_alone_takes_the_cores_the_finished_one_gave_back(
    tmp_path, monkeypatch
):
    """Once no run waits, a job still training is told to take the freed core mid-run: its
    metrics.jsonl says so, and it trains the numbers it trains alone."""
    import lm.compare.jobs as jobs_module

    cfg = write_config(
        tmp_path / "tiny.yaml",
        data={"cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 40, "log_every": 10, "eval_every": 0, "checkpoint_every": 0},
    )
    # The long run waits before its sixth step until the sweep has told it to widen.
    pauses = Pauses(tmp_path, [{"where": "step", "at": 5, "wait_for": "go.fifo", "only": "long"}])
    monkeypatch.setattr(os, "environ", pauses.env())
    widened = []
    widen = jobs_module._Worker.widen

    def told(worker, threads):
        had = worker.threads
        widen(worker, threads)
        if worker.threads != had:  # told now (the sweep asks again at every look)
            widened.append(worker.threads)
            with open(tmp_path / "go.fifo", "w") as go:
                go.write("go\n")

    monkeypatch.setattr(jobs_module._Worker, "widen", told)
    long, short = tmp_path / "long", tmp_path / "short"
    queue = [
        Job(long, [str(cfg), "--out", str(long), "--overwrite"], 40),
        Job(short, [str(cfg), "--out", str(short), "--overwrite", "--set", "train.max_steps=4"], 4),
    ]
    jobs_module.run_jobs(queue, 2, 0, lambda line: None, cores=2)
    pauses.close()
    assert widened == [2]
    logged = [json.loads(line) for line in (long / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("threads") for r in logged if "train_loss" in r] == [2, None, None, None]
    assert json.loads((long / "run.json").read_text())["ran"]["threads"] == 1  # at its start
    assert main(["train", str(cfg), "--out", str(tmp_path / "alone"), "--quiet"]) == 0
    assert losses(long) == losses(tmp_path / "alone")
    assert_same_weights(long, tmp_path / "alone")
