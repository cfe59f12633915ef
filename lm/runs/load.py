"""A trained model from its run directory: the config, the tokenizer and the weights of the
newest complete checkpoint (or a named one), checked against each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lm.config.errors import LMError
from lm.config.sections import Config
from lm.data.tokenizer import TextTokenizer
from lm.model.transformer import TransformerLM
from lm.runs.checkpoint import (
    CHECKPOINTS,
    CheckpointError,
    latest_checkpoint,
    load_weights,
    newest_intact,
    read_state,
)
from lm.runs.code import read_run_config
from lm.runs.directory import CONFIG, TOKENIZER


@dataclass
class LoadedRun:
    """A trained run, ready to use: its config, tokenizer and model (in eval mode)."""

    config: Config
    tokenizer: TextTokenizer
    model: TransformerLM
    checkpoint: Path
    """The checkpoint folder the weights came from."""
    step: int
    """Optimizer steps the weights had trained."""
    run_dir: Path | None = None


def _named_checkpoint(run_dir: Path, checkpoint: str | Path, flag: str) -> Path:
    """``--checkpoint`` (``flag``) as a path, or as the name of one of the run's checkpoints
    (``step_00000030``)."""
    path = Path(checkpoint)
    if path.exists():
        return path
    named = run_dir / CHECKPOINTS / path.name
    if path.parent == Path(".") and named.exists():
        return named
    raise CheckpointError(
        f"{flag} {checkpoint}: no such checkpoint (give a path or a name in "
        f"{run_dir / CHECKPOINTS})"
    )


def load_run(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    device: str = "cpu",
    flag: str = "--checkpoint",
) -> LoadedRun:
    """The trained model of a run (newest checkpoint unless one is named, ``flag`` in an error),
    in eval mode."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        raise LMError(f"{run_dir}: is a file, not a run directory (give the folder lm train wrote)")
    if not run_dir.is_dir():
        raise LMError(f"{run_dir}: no such run directory")
    if not (run_dir / CONFIG).is_file():
        raise LMError(f"{run_dir}: not a run directory (no {CONFIG})")
    config = read_run_config(run_dir)
    tokenizer = TextTokenizer.load(run_dir / TOKENIZER)
    if config.model.vocab_size != tokenizer.vocab_size:
        raise CheckpointError(
            f"{run_dir}: config.yaml says vocab_size={config.model.vocab_size} but "
            f"tokenizer.json has {tokenizer.vocab_size} tokens"
        )
    if checkpoint is not None:
        path: Path | None = _named_checkpoint(run_dir, checkpoint, flag)
    else:
        path = latest_checkpoint(run_dir)
    if path is None:
        raise LMError(f"{run_dir}: no checkpoint yet (train first, or wait for the first save)")
    model = TransformerLM(config.model)
    folder = path if path.is_dir() else path.parent
    try:
        load_weights(model, path)
    except CheckpointError as e:
        older = newest_intact(run_dir, folder) if checkpoint is None else None
        if older is None:
            raise
        raise CheckpointError(
            f"{e}; the older checkpoint {older.name} is intact: pass {flag} {older.name}"
        ) from None
    step = read_state(folder)["step"] if (folder / "state.json").is_file() else 0
    return LoadedRun(config, tokenizer, model.to(device).eval(), path, step, run_dir)
