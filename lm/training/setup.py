"""A run directory made ready for training: a new run (refusing to clobber one, or clearing it
with ``--overwrite``), a resume (the newest intact checkpoint, the config's changes checked), or
a start from another run's weights (``--init-from``: its tokenizer, shapes that fit)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lm.config.errors import ConfigError, LMError, SharedError
from lm.config.load import config_diff
from lm.config.names import BUILTIN_TOKENIZERS, readers, task_of
from lm.config.sections import Config, ModelConfig
from lm.data.tokenizer import TextTokenizer
from lm.model.transformer import TransformerLM
from lm.runs.checkpoint import (
    CHECKPOINTS,
    CheckpointError,
    intact,
    latest_checkpoint,
    load_weights,
    newest_intact,
    read_state,
)
from lm.runs.code import read_run_config
from lm.runs.directory import CONFIG, METRICS, PROVENANCE, TOKENIZER


def refuse_to_clobber(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Nothing in ``run_dir`` changes unless the user asked: a run there needs --resume or
    --overwrite."""
    existing = latest_checkpoint(run_dir)
    has_run = existing is not None or (run_dir / METRICS).exists()
    if has_run and not (resume or overwrite):
        where = f"checkpoint {existing.name}" if existing is not None else "metrics.jsonl"
        raise LMError(
            f"{run_dir} already holds a run ({where}); pass --resume to continue it "
            "or --overwrite to start again"
        )


def clear_run(run_dir: Path) -> None:
    """Remove what an earlier run wrote (the lock stays)."""
    shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
    for name in (METRICS, CONFIG, TOKENIZER, PROVENANCE, "eval.json"):
        (run_dir / name).unlink(missing_ok=True)
    for result in run_dir.glob("eval.*.json"):  # lm eval's results with other RoPE extensions
        result.unlink()
    for events in run_dir.glob("events.out.tfevents.*"):  # TensorBoard's, of the earlier run
        events.unlink()


def short_validation(config: Config, val_tokens: int) -> str | None:
    """A warning when the validation split is shorter than one context window: every
    validation loss is then measured on a single window shorter than the trained context."""
    C = config.model.context_length
    if val_tokens > C:
        return None
    return (
        f"lm: warning: the validation split holds {val_tokens} tokens, not more than "
        f"model.context_length {C}: validation loss is measured on one window of "
        f"{max(val_tokens - 1, 0)} predictions, not at the trained context"
    )


def resume_checkpoint(run_dir: Path, log: Callable[[str], None]) -> Path | None:
    """The checkpoint ``--resume`` continues from: the newest, or when it is damaged the newest
    intact one (the damaged one is moved aside as ``damaged-step_N``, kept but never loaded)."""
    newest = latest_checkpoint(run_dir)
    if newest is None or intact(newest):
        return newest
    older = newest_intact(run_dir, newest)
    if older is None:
        read_state(newest)  # the precise reason when it is state.json (bad JSON, no step)
        raise CheckpointError(
            f"{newest}: damaged (a file does not match its checksum) and no older checkpoint is "
            "intact; pass --overwrite to start again"
        )
    aside = newest.with_name(f"damaged-{newest.name}")
    newest.rename(aside)
    log(f"lm: {newest.name} is damaged (moved to {aside.name}); resuming from {older.name}")
    return older


# Model keys a run may change from the one it starts from: none of them is in the weights.
# What a run started from another's weights may set anew: none of these changes a weight's shape
# (RoPE's extension and base are how positions are read, as in the PI paper's fine-tuning).
_MAY_CHANGE = (
    "context_length", "dropout", "kernel", "rope_scaling", "rope_original_context", "rope_base",
)  # fmt: skip


def _init_source(source: Path, flag: str = "--init-from") -> tuple[Config, Path]:
    """The config and newest checkpoint of the run whose weights a new run starts from."""
    where = f"{flag} {source}"
    if not (source / CONFIG).is_file():
        raise LMError(f"{where}: not a run directory (no {CONFIG})")
    if not (source / TOKENIZER).is_file():
        raise LMError(f"{where}: the run has no {TOKENIZER}")
    checkpoint = latest_checkpoint(source)
    if checkpoint is None:
        raise LMError(f"{where}: the run has no checkpoint yet")
    return read_run_config(source), checkpoint


def _check_fits(source: Path, saved: ModelConfig, model: TransformerLM, flag: str) -> None:
    """The model keys that change what the weights compute, each named (the first that differs),
    then every parameter of ``model`` in the source checkpoint with the same shape (the first
    that is not is named); ``flag`` names ``source`` (``--init-from``)."""
    _check_keys(source, saved, model.config, flag)
    from safetensors import SafetensorError, safe_open

    file = latest_checkpoint(source) / "model.safetensors"
    try:
        with safe_open(str(file), "pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: cannot read the weights ({e})") from None
    tied = {"embed.weight", "head.weight"} if model.config.tie_embeddings else set()
    for name, tensor in model.state_dict().items():
        shape = shapes.get(name)
        if shape is None and name in tied:
            shape = next((shapes[t] for t in tied if t in shapes), None)
        if shape is None:
            raise LMError(f"{flag} {source}: parameter {name} is not in its weights")
        if shape != tuple(tensor.shape):
            raise LMError(
                f"{flag} {source}: parameter {name} has shape {list(shape)} there but "
                f"{list(tensor.shape)} in this model"
            )


def _check_keys(source: Path, saved: ModelConfig, ours: ModelConfig, flag: str) -> None:
    """The model keys the weights depend on are the source's: all but ``_MAY_CHANGE`` and the
    scheme keys (the rows' ``keys``) that no scheme of either model reads; CoPE's ``cope_max``
    as it ran (a null is the context plus one of its own run)."""
    schemes = set(saved.layer_positions) | set(ours.layer_positions)
    for key in ModelConfig.__dataclass_fields__:
        if key in _MAY_CHANGE or key == "vocab_size":
            continue
        if readers(key) and not readers(key, schemes):  # a scheme's key neither model reads
            continue
        there, here = getattr(saved, key), getattr(ours, key)
        if key == "cope_max":
            there, here = saved.cope_positions, ours.cope_positions
        if there != here:
            raise LMError(
                f"{flag} {source}: model.{key} is {there!r} there and {here!r} here (only "
                f"{', '.join(_MAY_CHANGE)} may change)"
            )


def recorded_init_from(run_dir: Path) -> str | None:
    """The run ``run_dir`` was started from with ``--init-from`` (run.json says), if any."""
    path = run_dir / PROVENANCE
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("init_from", {}).get("run")
    except (OSError, ValueError, AttributeError):
        return None


def config_for_init(
    config: Config,
    source: str | Path,
    log: Callable[[str], None] | None = None,
    flag: str = "--init-from",
) -> Config:
    """``config`` made to start from ``source``'s weights: it tokenizes with ``source``'s
    tokenizer.json (the ids the weights know), and its model must fit them; checked here,
    before any data is read. A tokenizer setting that this replaces, other than what the source
    itself was trained with, gets a note through ``log``; config.yaml records what is used.
    ``flag`` names ``source`` in an error (the API's ``init_from``)."""
    source = Path(source)
    saved, _ = _init_source(source, flag)
    own = source / TOKENIZER
    named = config.data.tokenizer
    if (
        named not in BUILTIN_TOKENIZERS
        and Path(named).resolve() != own.resolve()
        and TextTokenizer.load(named).to_json() != TextTokenizer.load(own).to_json()
    ):
        raise LMError(
            f"data.tokenizer: {named} is not the tokenizer of {flag} {source}; its "
            f"weights need {own} (leave data.tokenizer as char, byte or bpe, or name it)"
        )
    if log is not None and named in BUILTIN_TOKENIZERS and named != saved.data.tokenizer:
        vocab = saved.model.vocab_size
        log(
            f"lm: note: data.tokenizer: {named} is not used: {flag} {source} needs its own "
            f"tokenizer ({own.resolve()}, {vocab} tokens), whose ids its weights know; "
            "config.yaml records it"
        )
    if log is not None and config.data.vocab_size not in (None, saved.data.vocab_size):
        log(
            f"lm: note: data.vocab_size: {config.data.vocab_size} is not used: the tokenizer is "
            "not trained anew"
        )
    # data.vocab_size sizes a tokenizer trained on the data; one read from a file has its own.
    # A generated task's char or byte tokenizer is its alphabet's: the same task and kind make
    # the source's ids (checked when the weights load), so the name stays, which the passkey
    # task, whose lengths are characters, needs.
    same = config.data.source == saved.data.source and named == saved.data.tokenizer
    keep = same and named in ("char", "byte") and task_of(config.data.source) is not None
    data = dataclasses.replace(config.data, tokenizer=named if keep else str(own.resolve()))
    config = config.replace(data=dataclasses.replace(data, vocab_size=None))
    if readers("cope_max", config.model.layer_positions) and config.model.cope_max is None:
        # CoPE's table is as long as its run's context plus one: kept at a new context.
        model = dataclasses.replace(config.model, cope_max=saved.model.cope_positions)
        config = config.replace(model=model)
    model_cfg = dataclasses.replace(config.model, vocab_size=saved.model.vocab_size)
    with torch.device("meta"):  # shapes only: no memory, no initialisation work
        _check_fits(source, saved.model, TransformerLM(model_cfg), flag)
    return config


def init_weights_from(
    model: TransformerLM, source: str | Path, tokenizer: TextTokenizer | None = None
) -> None:
    """Load the newest weights of run ``source`` into ``model`` (the optimizer starts fresh),
    having checked that the new run's ``tokenizer`` (when given) is the one they learned."""
    source = Path(source)
    saved, checkpoint = _init_source(source)
    _check_fits(source, saved.model, model, "--init-from")
    learned = TextTokenizer.load(source / TOKENIZER).to_json()
    if tokenizer is not None and tokenizer.to_json() != learned:
        raise LMError(
            f"--init-from {source}: this run's tokenizer differs from the one its weights "
            f"were trained with; set data.tokenizer: {source / TOKENIZER}"
        )
    load_weights(model, checkpoint)


def record_init_from(run_dir: Path, source: str | Path) -> None:
    """Note in ``run_dir``'s run.json which run, checkpoint and step its weights started from."""
    source = Path(source)
    _, checkpoint = _init_source(source)
    path = run_dir / PROVENANCE
    record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    folder = checkpoint if checkpoint.is_dir() else checkpoint.parent
    record["init_from"] = {
        "run": str(source.resolve()),
        "checkpoint": folder.name,
        "step": read_state(folder)["step"],
    }
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def check_has_optimizer(run_dir: Path, checkpoint: Path, state: dict[str, Any]) -> None:
    """``--resume`` continues the optimizer too: a checkpoint of weights alone (an imported run)
    has nothing to continue, and a new run starts from its weights instead."""
    if "optimizer.safetensors" in state.get("sha256", {}):
        return
    origin = state.get("imported_from")
    what = f"was imported from {origin}" if origin else f"holds weights only ({checkpoint.name})"
    raise SharedError(
        f"{run_dir}: {what} and has no optimizer state, so --resume has nothing to continue; "
        f"start a new run from its weights: lm train CONFIG --init-from {run_dir} --out NEW_RUN"
    )


def check_resumable(saved: Config, config: Config) -> None:
    """Resuming may change the train section (e.g. more steps), not the model or the data;
    ``model.kernel: auto`` resumes with the kernel the run chose."""
    for name, (old, new) in config_diff(saved, config).items():
        if name.startswith("train.") or (name == "model.vocab_size" and new is None):
            continue
        if name == "model.kernel" and new == "auto":  # it resumes with the kernel it chose
            continue
        raise ConfigError(
            f"{name}: the run was trained with {old!r}, this config says {new!r}; "
            f"resume with the run's config ({CONFIG})"
        )


def with_vocab(config: Config, tokenizer: TextTokenizer) -> Config:
    """``config`` with ``model.vocab_size`` from the tokenizer (a stated one must agree)."""
    vocab = tokenizer.vocab_size
    stated = config.model.vocab_size
    if stated is not None and stated != vocab:
        raise ConfigError(
            f"model.vocab_size: the config says {stated} but the tokenizer has {vocab} tokens "
            "(leave model.vocab_size out; it comes from the tokenizer)"
        )
    return config.replace(model=dataclasses.replace(config.model, vocab_size=vocab))
