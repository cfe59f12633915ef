"""The runs of a sweep trained side by side (``lm compare --jobs N``), in processes of their own.

A model this small leaves most of a machine idle: a 0.8M-parameter run keeps two CPU cores
less than busy and a GPU nearly empty. With ``--jobs N``, N runs train at once, in N job workers:
processes (``python -m lm.compare.worker``) that each train one run after another as
``python -m lm train`` would, with the sweep's own config, keys and seed (the command its
``run.json`` records), and pay their start (imports) once.
On CPU the cores are divided between the jobs through ``train.threads``, which a run records
and which does not change its numbers: every run equals the same run trained alone, bit for bit
(tests/test_train.py holds every scheme's gradients equal on one thread and on two). The last
runs of a sweep, fewer than N, take the cores the others leave: one that would get more cores
than a full round's share waits for them while the runs holding them are nearly done, and
otherwise starts on what is free; once no run waits, the runs still training share the cores
the finished ones gave back (their workers are told mid-run; their metrics.jsonl says
``threads`` from the next logged step). The last run of all, when it would start with no other
running, trains in lm compare's own process instead, as one run at a time does: it has every
core anyway, and a process of its own would pay its start (imports, data) for nothing. On GPUs
the jobs go round-robin over the visible devices, several to a device when there are more jobs
than devices.

Progress is read from each run's ``metrics.jsonl``. Ctrl-C or SIGTERM reaches every job, each
saves a checkpoint at its next step that logs, evaluates or saves, and the same command resumes
them; a job that fails stops the others the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
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
    n = min(n, len(jobs))  # --jobs 5 for 3 runs runs 3 at once, and divides the cores by 3
    waiting, running = list(jobs), {}
    workers: list[_Worker] = []  # every worker started
    idle: list[_Worker] = []  # those waiting for a job
    last: Job | None = None
    stopped: list[tuple[int, str]] = []  # (exit status, what the job said last) of early ends
    last_progress = time.monotonic()
    with StopSignals() as signals, contextlib.ExitStack() as ends:
        while running or (waiting and not (stopped or signals.received)):
            if here is not None and not running and len(waiting) == 1:
                last = waiting.pop(0)  # alone: trained in this process, below
                break
            while waiting and len(running) < n and not (stopped or signals.received):
                threads = None
                if cores is not None:
                    threads = job_threads(cores, n, len(waiting), list(running.values()))
                    if threads is None:
                        break  # the runs holding the cores it will get are nearly done
                job = waiting.pop(0)
                if not idle:
                    workers.append(_Worker(len(workers), gpus))
                    idle.append(workers[-1])
                    ends.callback(workers[-1].close)  # however the sweep ends
                running[job] = worker = idle.pop()
                worker.start(job, threads)
                on = f", {threads} thread{'s' * (threads != 1)}" if threads else ""
                log(f"compare: training {job.run_dir} ({len(running)} of {n} jobs running{on})")
            time.sleep(0.2)
            stopped += _ended(running, idle, signals)
            if stopped or signals.received:  # each job saves a checkpoint, then ends
                for worker in running.values():
                    worker.stop()
            elif cores is not None and not waiting:
                _share_freed(cores, list(running.values()))
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


def _ended(
    running: dict[Job, _Worker], idle: list[_Worker], signals: StopSignals
) -> list[tuple[int, str]]:
    """Take the jobs that have ended out of ``running`` (their workers, still alive, back to
    ``idle``); return (exit status, what the job said last) of those that did not finish."""
    stopped = []
    for job, worker in list(running.items()):
        code = worker.returncode()
        if code is not None:
            del running[job]
            said = worker.said(job, code)
            if worker.alive():
                idle.append(worker)
            # Told to stop, a job that ends by the signal was interrupted: in its loop the
            # signal only asks for a checkpoint, and earlier ones stay intact.
            told = worker.asked or signals.received is not None
            if told and code in (-signal.SIGINT, -signal.SIGTERM):
                code = 130
            if code:
                stopped.append((code, said))
    return stopped


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


class _Worker:
    """A job worker: its process (``python -m lm.compare.worker``), which trains one run after
    another, what it writes to standard error kept in a file, and the job it trains now."""

    def __init__(self, index: int, gpus: int):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(index % gpus)
        # Open as long as the worker runs; each job's part of it is read when the job ends.
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115
        # The threads its job is to take when told (SIGUSR1): cores others gave back.
        handle, name = tempfile.mkstemp(prefix="lm-worker-", suffix=".threads")
        os.close(handle)
        self._widen_file = Path(name)
        self.ready = threading.Event()  # it hears SIGUSR1 now (before, the signal would end it)
        # The worker shares lm compare's process group: Ctrl-C in a terminal reaches both.
        self._process = subprocess.Popen(
            [sys.executable, "-m", "lm.compare.worker", str(self._widen_file)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            encoding="utf-8",
        )
        # Exit statuses of its jobs as the worker answers them; None: the worker has ended.
        self._answers: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()
        self.job: Job | None = None
        self.threads, self.asked, self._said_from = 0, False, 0

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            answer = json.loads(line)
            if "ready" in answer:
                self.ready.set()
            else:
                self._answers.put(int(answer["code"]))
        self._answers.put(None)

    def start(self, job: Job, threads: int | None) -> None:
        """Train ``job`` (on ``threads`` threads; None: its config's)."""
        args = [*job.args, "--quiet"]
        if threads:
            args += ["--set", f"train.threads={threads}"]
        self.job, self.threads, self.asked = job, threads or 0, False
        self._said_from = os.fstat(self._stderr.fileno()).st_size
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(args) + "\n")
            self._process.stdin.flush()
        except OSError:  # the worker has ended: returncode() says how
            pass

    def returncode(self) -> int | None:
        """The exit status of the job it trains, once it has ended (None: still training)."""
        try:
            answer = self._answers.get_nowait()
        except queue.Empty:
            return None
        if answer is None:  # the worker ended, and its job with it
            return self._process.wait()
        return answer

    def alive(self) -> bool:
        return self._process.poll() is None

    def widen(self, threads: int) -> None:
        """Let the job it trains take ``threads`` threads from now on (once it hears the
        signal; a job told to stop is left alone)."""
        if threads <= self.threads or self.asked or not self.ready.is_set() or not self.alive():
            return
        self._widen_file.write_text(str(threads), encoding="utf-8")
        self._process.send_signal(signal.SIGUSR1)
        self.threads = threads

    def stop(self) -> None:
        """Ask once: a second signal could end the job while it finishes its checkpoint."""
        if not self.asked and self.alive():
            self._process.send_signal(signal.SIGTERM)
            self.asked = True

    def said(self, job: Job, code: int) -> str:
        """The job's last line of standard error (its error, said in one line), with its run;
        ``code``: its exit status."""
        self._stderr.seek(self._said_from)
        lines = [line.strip() for line in self._stderr.read().splitlines() if line.strip()]
        if not lines:
            return f"{job.run_dir}: ended with exit status {code}"
        return f"{job.run_dir}: {lines[-1].removeprefix('lm: error: ').removeprefix('lm: ')}"

    def close(self) -> None:
        """End the worker (the end of its input) and wait for it."""
        with contextlib.suppress(OSError):
            assert self._process.stdin is not None
            self._process.stdin.close()
        try:
            self._process.wait(timeout=CLOSE_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._stderr.close()
        self._widen_file.unlink(missing_ok=True)


CLOSE_S = 60.0
"""How long an idle worker may take to end once its input has ended."""


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


def _share_freed(cores: int, running: list[_Worker]) -> None:
    """With no run waiting, the runs still training share every core: each is told its share
    (the first ones one more where they do not divide evenly) where that is more than it has."""
    if not running:
        return
    share, extra = divmod(cores, len(running))
    for i, worker in enumerate(running):
        if share + (i < extra) > 0:
            worker.widen(share + (i < extra))


NEARLY_DONE = 0.9  # of its steps: a run this far gives its cores back soon


def job_threads(cores: int, n: int, waiting: int, running: list[_Worker]) -> int | None:
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
