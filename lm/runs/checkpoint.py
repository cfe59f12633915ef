"""Checkpoints that are complete or absent, never half-written, and that load without pickle.

A checkpoint is a folder ``RUN_DIR/checkpoints/step_00001234/`` holding

* ``model.safetensors`` -- the weights (tied weights stored once);
* ``optimizer.safetensors`` -- every optimizer state tensor, flattened to named tensors;
* ``state.json`` -- step, optimizer hyper-parameters, RNG states, data position, elapsed time.

It is written into a hidden temporary folder, flushed to disk, then renamed into place in one
step: a crash at any moment leaves either the previous checkpoints alone or the new one whole.
Nothing here unpickles: weights and optimizer tensors through ``safetensors``, the rest JSON.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from lm.config.errors import LMError

CHECKPOINTS = "checkpoints"
_NAME = re.compile(r"^step_(\d{8})$")


class CheckpointError(LMError):
    """A checkpoint cannot be written or read."""


@dataclass(frozen=True)
class FullState:
    """Weights and optimizer state gathered from a sharded run (``lm.training.parallel``), saved
    in the same files and form as a one-process run's."""

    weights: dict[str, torch.Tensor]  # tied names dropped, as safetensors.save_model drops them
    aliases: dict[str, str]  # dropped name -> kept name (save_model's file metadata)
    optimizer: dict[str, Any]  # optimizer.state_dict()'s form: parameters numbered


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary folders are never listed)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.match(path.name)
        if match and (path / "state.json").is_file() and (path / "model.safetensors").is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into named tensors and a JSON-able remainder."""
    tensors: dict[str, torch.Tensor] = {}
    per_param: dict[str, dict[str, Any]] = {}
    for pid, slots in state["state"].items():
        plain = {}
        for key, value in slots.items():
            if torch.is_tensor(value):
                tensors[f"{pid}.{key}"] = value.detach().contiguous().cpu()
            else:
                plain[key] = value
        per_param[str(pid)] = plain
    return tensors, {"param_groups": state["param_groups"], "plain": per_param}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict:
    state: dict[int, dict[str, Any]] = {int(pid): dict(v) for pid, v in meta["plain"].items()}
    for name, value in tensors.items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def rng_state() -> dict[str, Any]:
    """Every generator the training step draws from (dropout), as JSON."""
    state = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available():
        state["cuda"] = [
            base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()
        ]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensor(s) for s in state["cuda"]])


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: nn.Module | FullState,
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Write checkpoint ``step`` atomically, then drop all but the newest ``keep``.

    ``model`` is the module, or a sharded run's :class:`FullState` (which holds the optimizer
    state too; ``optimizer`` is then not read).

    On a failed write (disk full, no permission) the temporary folder is removed, earlier
    checkpoints are untouched, and :class:`CheckpointError` says what happened in one line.
    """
    root = Path(run_dir) / CHECKPOINTS
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{checkpoint_name(step)}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        if isinstance(model, FullState):
            save_file(model.weights, str(tmp / "model.safetensors"), model.aliases or None)
            optimizer_state = model.optimizer
        else:
            save_model(model, str(tmp / "model.safetensors"))
            optimizer_state = optimizer.state_dict() if optimizer is not None else None
        meta: dict[str, Any] = {}
        if optimizer_state is not None:
            tensors, meta = _flatten_optimizer(optimizer_state)
            save_file(tensors, str(tmp / "optimizer.safetensors"))
        # Checksums: a flipped bit inside tensor data is otherwise undetectable.
        sums = {f.name: _sha256(f) for f in sorted(tmp.iterdir())}
        payload = {"step": step, "optimizer": meta, "sha256": sums, **state}
        (tmp / "state.json").write_text(json.dumps(payload), encoding="utf-8")
        for f in tmp.iterdir():
            _fsync(f)
        if final.exists():  # the same step saved again (after a resume): replace it whole
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(root)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = e.strerror or str(e)
        raise CheckpointError(f"could not write checkpoint {final}: {reason}") from None
    for old in complete_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):  # left by a process killed mid-write
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path) -> None:
    """Check ``path`` against the checksum its checkpoint's ``state.json`` recorded, if any."""
    state_file = path.parent / "state.json"
    if not state_file.is_file():
        return
    expected = read_state(path.parent).get("sha256", {}).get(path.name)
    if expected is not None and _sha256(path) != expected:
        raise CheckpointError(f"{path}: damaged file (its checksum does not match state.json)")


def intact(folder: Path) -> bool:
    """Whether checkpoint ``folder`` reads back: a valid state.json and every file matching the
    checksum it recorded."""
    try:
        sums = read_state(folder).get("sha256", {})
        return all(_sha256(folder / name) == digest for name, digest in sums.items())
    except (CheckpointError, OSError, AttributeError):
        return False


def newest_intact(run_dir: str | Path, before: Path | None = None) -> Path | None:
    """The newest checkpoint of ``run_dir`` that reads back (older than ``before`` if given)."""
    found = complete_checkpoints(run_dir)
    if before is not None:
        found = [f for f in found if f.name < before.name]
    return next((f for f in reversed(found) if intact(f)), None)


def read_state(path: str | Path) -> dict[str, Any]:
    path = Path(path) / "state.json"
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent}: not a checkpoint (no state.json)") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: not a valid checkpoint state (bad JSON)") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"{path}: not a valid checkpoint state (no step)")
    return state


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load ``model.safetensors`` into ``model``; any damage or mismatch is one line."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    verify(path)
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except SafetensorError as e:
        raise CheckpointError(f"{path}: damaged safetensors file ({first_line(e)})") from None
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit this model ({_shape_hint(e)})") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read weights ({first_line(e)})") from None
    if missing or unexpected:
        names = ", ".join(sorted(missing or unexpected)[:3])
        kind = "missing" if missing else "unexpected"
        raise CheckpointError(f"{path}: weights do not fit this model ({kind}: {names})")


def load_optimizer(optimizer: torch.optim.Optimizer, path: str | Path, state: dict) -> None:
    file = Path(path) / "optimizer.safetensors"
    try:
        optimizer.load_state_dict(read_optimizer(path, state))
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{file}: cannot restore the optimizer ({first_line(e)})") from None


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint's weights as named CPU tensors (tied names stored once), checked."""
    file = Path(path) / "model.safetensors"
    if not file.is_file():
        raise CheckpointError(f"{file}: no such weights file")
    verify(file)
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file}: damaged safetensors file ({first_line(e)})") from None


def read_optimizer(path: str | Path, state: dict) -> dict[str, Any]:
    """A checkpoint's optimizer state in ``optimizer.state_dict()``'s form, checked."""
    file = Path(path) / "optimizer.safetensors"
    verify(file)
    try:
        return _unflatten_optimizer(load_file(str(file)), state["optimizer"])
    except (SafetensorError, OSError, KeyError, ValueError) as e:
        raise CheckpointError(f"{file}: cannot restore the optimizer ({first_line(e)})") from None


def first_line(e: BaseException) -> str:
    """An exception's message as one line: its first, or its type's name when it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _shape_hint(e: RuntimeError) -> str:
    for line in str(e).splitlines():
        if "size mismatch" in line or "shape" in line:
            return line.strip().rstrip(".")
    return first_line(e)
