"""The runs of a sweep trained side by side (``lm compare --jobs N``), each in its own process.

A model this small leaves most of a machine idle: a 0.8M-parameter run keeps two CPU cores
less than busy and a GPU nearly empty. With ``--jobs N``, N runs train at once, each as ``python
-m lm train`` with the sweep's own config, keys and seed (the command its ``run.json`` records).
On CPU the cores are divided between the jobs through ``train.threads``, which a run records
and which does not change its numbers: every run equals the same run trained alone, bit for bit
(tests/test_train.py holds every scheme's gradients equal on one thread and on two). The last
runs of a sweep, fewer than N, take the cores the others leave: one that would get more cores
than a full round's share waits for them while the runs holding them are nearly done, and
otherwise starts on what is free. The last run of all, when it would start with no other
running, trains in lm compare's own process instead, as one run at a time does: it has every
core anyway, and a process of its own would pay its start (imports, data) for nothing. On GPUs
the jobs go round-robin over the visible devices, several to a device when there are more jobs
than devices.

Progress is read from each run's ``metrics.jsonl``. Ctrl-C or SIGTERM reaches every job, each
saves a checkpoint at its next step that logs, evaluates or saves, and the same command resumes
them; a job that fails stops the others the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lm.config.errors import LMError
from lm.runs.checkpoint import latest_checkpoint
from lm.runs.directory import METRICS
from lm.runtime.host import StopSignals
from lm.training.metrics import read_metrics

PROGRESS_EVERY_S = 30.0


@dataclass(frozen=True, eq=False)
class Job:
    """One run of a sweep: its folder, the ``lm train`` arguments that make it, and its steps."""

    run_dir: Path
    args: list[str]
    max_steps: int


def run_jobs(
    jobs: list[Job],
    n: int,
    gpus: int,
    log: Callable[[str], None],
    cores: int | None = None,
    here: Callable[[Job], None] | None = None,
) -> None:
    """Train ``jobs``, ``n`` at a time (round-robin over ``gpus`` devices when there are any),
    until every one has finished; ``cores``: CPU threads to divide between them (None: each
    run keeps its config's). A job that fails or is interrupted, or a signal to this process,
    stops every job at its next checkpoint; nothing more starts. ``here`` trains a job in this
    process: the last one, when it would start with no other running (it then has every core
    and pays no process's start, as one run at a time does)."""
    waiting, running = list(jobs), {}
    last: Job | None = None
    stopped: list[tuple[int, str]] = []  # (exit status, what the job said last) of early ends
    started, last_progress = 0, time.monotonic()
    with StopSignals() as signals:
        while running or (waiting and not (stopped or signals.received)):
            while waiting and len(running) < n and not (stopped or signals.received):
                if here is not None and not running and len(waiting) == 1:
                    last = waiting.pop(0)
                    break
                threads = None
                if cores is not None:
                    threads = job_threads(cores, n, len(waiting), list(running.values()))
                    if threads is None:
                        break  # the runs holding the cores it will get are nearly done
                job = waiting.pop(0)
                running[job] = _Process(job, started, gpus, threads)
                started += 1
                on = f", {threads} thread{'s' * (threads != 1)}" if threads else ""
                log(f"compare: training {job.run_dir} ({len(running)} of {n} jobs running{on})")
            if last is not None:
                break
            time.sleep(0.2)
            for job, process in list(running.items()):
                code = process.returncode()
                if code is not None:
                    del running[job]
                    said = process.said(job)
                    # Told to stop, a job that ends by the signal was interrupted: in its loop
                    # the signal only asks for a checkpoint, and earlier ones stay intact.
                    told = process.asked or signals.received is not None
                    if told and code in (-signal.SIGINT, -signal.SIGTERM):
                        code = 130
                    if code:
                        stopped.append((code, said))
            if stopped or signals.received:  # each job saves a checkpoint, then ends
                for process in running.values():
                    process.stop()
            if running and time.monotonic() - last_progress > PROGRESS_EVERY_S:
                log("compare: " + "; ".join(_progress(job) for job in running))
                last_progress = time.monotonic()
    failed = [said for code, said in stopped if code != 130]
    if failed:
        raise LMError(f"{failed[0]}; {_what_was_saved(jobs, waiting)}")
    if stopped or signals.received or waiting:
        raise KeyboardInterrupt(f"{_what_was_saved(jobs, waiting)}; the same command again resumes")
    if last is not None and here is not None:
        log(f"compare: training {last.run_dir} (the last run: in this process, alone)")
        here(last)


def _what_was_saved(jobs: list[Job], waiting: list[Job]) -> str:
    """Where each run of a stopped sweep stands: the step of its newest checkpoint, none yet, or
    not started (the run folders named as the report names them)."""
    parts = []
    for job in jobs:
        name = "/".join(job.run_dir.parts[-2:])
        if job in waiting:
            parts.append(f"{name} had not started")
        elif (checkpoint := latest_checkpoint(job.run_dir)) is not None:
            parts.append(f"{name} saved step {int(checkpoint.name.rsplit('_', 1)[-1])}")
        else:
            parts.append(f"{name} has no checkpoint yet")
    return "stopped: " + ", ".join(parts)


class _Process:
    """One job's ``lm train`` process, what it writes to standard error kept in a file."""

    def __init__(self, job: Job, index: int, gpus: int, threads: int | None):
        self.job, self.threads = job, threads or 0
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(index % gpus)
        # Open as long as the process runs; said() reads and closes it.
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115
        command = [sys.executable, "-m", "lm", "train", *job.args, "--quiet"]
        if threads:
            command += ["--set", f"train.threads={threads}"]
        # The job shares lm compare's process group: Ctrl-C in a terminal reaches both.
        self.asked = False
        self._process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=self._stderr
        )

    def returncode(self) -> int | None:
        return self._process.poll()

    def stop(self) -> None:
        """Ask once: a second signal could end the job while it finishes its checkpoint."""
        if not self.asked and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            self.asked = True

    def said(self, job: Job) -> str:
        """The job's last line of standard error (its error, said in one line), with its run."""
        self._stderr.seek(0)
        lines = [line.strip() for line in self._stderr.read().splitlines() if line.strip()]
        self._stderr.close()
        if not lines:
            return f"{job.run_dir}: ended with exit status {self._process.returncode}"
        return f"{job.run_dir}: {lines[-1].removeprefix('lm: error: ').removeprefix('lm: ')}"


def _newest(job: Job) -> dict | None:
    """The run's newest logged training step from its metrics.jsonl, if it has logged one."""
    try:
        records = read_metrics(job.run_dir / METRICS)
    except LMError:  # a progress line is no place to report a damaged log: the run will
        return None
    return next((r for r in reversed(records) if "train_loss" in r), None)


def _progress(job: Job) -> str:
    """``position=rope/seed1 step 150/600 loss 1.9213``, from the run's newest logged step."""
    name, last = "/".join(job.run_dir.parts[-2:]), _newest(job)
    if last is None:
        return f"{name} starting"
    return f"{name} step {last['step']}/{job.max_steps} loss {last['train_loss']:.4f}"


NEARLY_DONE = 0.9  # of its steps: a run this far gives its cores back soon


def job_threads(cores: int, n: int, waiting: int, running: list[_Process]) -> int | None:
    """CPU threads for the next of ``waiting`` jobs to start beside ``running``: ``cores``
    divided between the jobs that will run together. The last ones, fewer than ``n``, get more
    than a full round's share: such a job waits (None) while the runs holding those cores are
    nearly done, and otherwise starts on the cores that are free."""
    share = max(1, cores // min(n, waiting))
    free = cores - sum(p.threads for p in running)
    if share <= max(1, cores // n) or free >= share:
        return share
    nearly_done = all(
        (last := _newest(p.job)) is not None and last["step"] >= NEARLY_DONE * p.job.max_steps
        for p in running
    )
    return None if nearly_done else max(1, free)
