"""The runs of a sweep trained side by side (``lm compare --jobs N``), each in its own process.

A model this small leaves most of a machine idle: a 0.8M-parameter run keeps two CPU cores
less than busy and a GPU nearly empty. With ``--jobs N``, N runs train at once, each as ``python
-m lm train`` with the sweep's own config, keys and seed (the command its ``run.json`` records).
On CPU the cores are divided between the jobs through ``train.threads`` (which a run records:
fp32 sums of a different number of threads round differently, so a run trained on one thread
equals the same run trained alone on one thread, bit for bit). On GPUs the jobs go round-robin
over the visible devices, several to a device when there are more jobs than devices.

Progress is read from each run's ``metrics.jsonl``. Ctrl-C or SIGTERM reaches every job, each
saves a checkpoint at its next step that logs, evaluates or saves, and the same command resumes
them; a job that fails stops the others the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from lm.config import LMError
from lm.runs import METRICS
from lm.runtime import StopSignals

PROGRESS_EVERY_S = 30.0


@dataclass(frozen=True, eq=False)
class Job:
    """One run of a sweep: its folder, the ``lm train`` arguments that make it, and its steps."""

    run_dir: Path
    args: list[str]
    max_steps: int


def run_jobs(jobs: list[Job], n: int, gpus: int, log: Callable[[str], None]) -> None:
    """Train ``jobs``, ``n`` at a time (round-robin over ``gpus`` devices when there are any),
    until every one has finished. A job that fails or is interrupted, or a signal to this
    process, stops every job at its next checkpoint; nothing more starts."""
    waiting, running = list(jobs), {}
    stopped: list[tuple[int, str]] = []  # (exit status, what the job said last) of early ends
    started, last_progress = 0, time.monotonic()
    with StopSignals() as signals:
        while running or (waiting and not (stopped or signals.received)):
            while waiting and len(running) < n and not (stopped or signals.received):
                job = waiting.pop(0)
                running[job] = _Process(job, started, gpus)
                started += 1
                log(f"compare: training {job.run_dir} ({len(running)} of {n} jobs running)")
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
        raise LMError(f"{failed[0]}; the other jobs stopped, each with a checkpoint")
    if stopped or signals.received or waiting:
        raise KeyboardInterrupt("every job saved a checkpoint; the same command again resumes")


class _Process:
    """One job's ``lm train`` process, what it writes to standard error kept in a file."""

    def __init__(self, job: Job, index: int, gpus: int):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(index % gpus)
        # Open as long as the process runs; said() reads and closes it.
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115
        command = [sys.executable, "-m", "lm", "train", *job.args, "--quiet"]
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


def _progress(job: Job) -> str:
    """``position=rope/seed1 step 150/600 loss 1.9213``, from the run's newest logged step."""
    name = "/".join(job.run_dir.parts[-2:])
    try:
        lines = (job.run_dir / METRICS).read_text(encoding="utf-8").splitlines()
        last = next(json.loads(x) for x in reversed(lines) if '"train_loss"' in x)
    except (OSError, ValueError, StopIteration):
        return f"{name} starting"
    return f"{name} step {last['step']}/{job.max_steps} loss {last['train_loss']:.4f}"


def threads_per_job(jobs: int) -> int:
    """The CPU threads each of ``jobs`` concurrent runs gets: the cores divided between them."""
    return max(1, torch.get_num_threads() // jobs)
