"""A run directory: what it holds, who may write it, and where outputs may go.

RUN_DIR/config.yaml       the fully resolved config (vocab_size filled in)
RUN_DIR/tokenizer.json    the tokenizer, loadable by any Hugging Face tool
RUN_DIR/run.json          where the run came from: git commit, torch, python, machine
RUN_DIR/metrics.jsonl     one JSON object per logged step
RUN_DIR/checkpoints/      see lm/runs/checkpoint.py
RUN_DIR/lock              present while a process trains into the directory
RUN_DIR/measured.json     what lm compare measured of the run (see lm/compare/measure.py)
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from lm.config.errors import LMError
from lm.config.load import config_diff, save_config
from lm.config.sections import Config
from lm.data.tokenizer import TextTokenizer
from lm.runs.code import read_run_config, record_code

CONFIG, TOKENIZER, METRICS, LOCK, PROVENANCE = (
    "config.yaml",
    "tokenizer.json",
    "metrics.jsonl",
    "lock",
    "run.json",
)


class RunLocked(LMError):
    """Another live process is training into this run directory."""


class RunLock:
    """An exclusive claim on a run directory, released on exit.

    The lock file records the owner's host and pid; a lock whose process is gone (it crashed or
    was killed) is stale and taken over, so a crash never leaves a run stuck.
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.held = False

    def acquire(self) -> None:
        me = {"host": socket.gethostname(), "pid": os.getpid()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self._owner()
                if owner is not None and _alive(owner):
                    raise RunLocked(
                        f"{self.path.parent}: another process (pid {owner['pid']} on "
                        f"{owner['host']}) is training into this run; wait for it or use --out"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its owner is gone
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.held = True
            return
        raise RunLocked(f"{self.path}: could not take the run lock")

    def _owner(self) -> dict[str, Any] | None:
        try:
            owner = json.loads(self.path.read_text())
            return owner if isinstance(owner, dict) else None
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _alive(owner: dict[str, Any]) -> bool:
    if owner.get("host") != socket.gethostname():
        return True  # another machine's process: cannot check, so respect it
    try:
        os.kill(int(owner["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, KeyError, TypeError):
        return True
    return True


def write_run_record(
    run_dir: Path,
    config: Config,
    tokenizer: TextTokenizer,
    ran: dict[str, Any] | None = None,
    resumed_step: int | None = None,
) -> None:
    """The run's config, its tokenizer, and where it came from; ``ran``: what it runs on, as
    resolved (device, dtype, kernel, threads, compile), which ``config.yaml``'s ``auto`` and
    null do not say.

    A fresh run writes all three. A resumed run (``resumed_step``: the step it continues from)
    keeps config.yaml as the run started and appends to run.json's ``resumes`` what this
    command changed: its command line, the step, each changed key as ``[before, now]``, and
    what it ran on.
    """
    if resumed_step is None or not (run_dir / CONFIG).is_file():
        save_config(config, run_dir / CONFIG)
        tokenizer.save(run_dir / TOKENIZER)
        record = {**provenance(), "ran": ran} if ran is not None else provenance()
        if kept := record_code(run_dir, config.model):  # the code of its outside schemes
            record["schemes"] = kept
        (run_dir / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")
        return
    started = read_run_config(run_dir)
    changed = {
        key: [old, new]
        for key, (old, new) in config_diff(started, config).items()
        if key != "model.vocab_size"
    }
    path = run_dir / PROVENANCE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict):
        record = {}
    resume = {"step": resumed_step, "argv": sys.argv, "changed": changed}
    if ran is not None:
        resume["ran"] = ran
    record["resumes"] = [*record.get("resumes", []), resume]
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def provenance() -> dict[str, Any]:
    """Where a run came from, recorded in ``run.json``."""
    commit = None
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        if out.returncode == 0:
            commit = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "git_commit": commit,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "argv": sys.argv,
    }


def check_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """A folder a command will create or write into; one line when it, or a folder above it,
    is a file."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                where = "is a file" if p == path else f"sits under {p}, a file"
                raise LMError(f"{flag} {path}: {where}, not a folder")
            break
    return path


def run_holding(path: str | Path) -> Path | None:
    """The run directory ``path`` lies in, however spelled (the nearest folder above it holding
    config.yaml and run.json, as every run does from its start), or None."""
    for folder in Path(path).resolve().parents:
        if (folder / CONFIG).is_file() and (folder / PROVENANCE).is_file():
            return folder
    return None


def refuse_overlap(
    out: str | Path, inputs: dict[str, str | Path | None], flag: str = "--out"
) -> None:
    """Refuse, before anything is touched, an output folder that is an input too (any spelling
    of the same folder: a trailing slash, ``..``, a symbolic link) or holds one: writing or
    replacing it would delete what the same command reads. ``inputs``: flag -> path."""
    for name, path in inputs.items():
        if path is not None and _same_or_inside(Path(path), Path(out)):
            where = "is" if _same_or_inside(Path(out), Path(path)) else "holds"
            raise LMError(
                f"{flag} {out}: {where} {name} {path}, which this command reads; writing it "
                f"would delete it; choose another {flag}"
            )


def _same_or_inside(inner: Path, outer: Path) -> bool:
    """``inner`` is ``outer`` or lies inside it, however either is spelled."""
    inner, outer = inner.resolve(), outer.resolve()
    if inner == outer or outer in inner.parents:
        return True
    if not outer.exists():
        return False
    # The same folder under two names resolve() cannot join (a bind mount, a hard link).
    return any(p.exists() and os.path.samefile(p, outer) for p in (inner, *inner.parents))
