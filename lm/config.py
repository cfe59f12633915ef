"""Typed, frozen configuration: one dataclass per section, loaded from YAML.

A config file has three sections, ``model``, ``data`` and ``train``; each component receives
only its own. Every key is checked once, at load: unknown keys, wrong types and impossible
combinations raise :class:`ConfigError` with a one-line message that names the key and says
what is allowed. Command-line overrides use dotted names (``train.lr=3e-4``) and go through
the same checks as the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml


class LMError(Exception):
    """An error caused by the user's input; the CLI prints its message as one line, exit 2."""


class SharedError(LMError):
    """An error every process of a ``torchrun`` job meets alike (they read the same command
    line, config and files, or agreed on it): rank 0 alone says it."""


class ConfigError(SharedError):
    """A config key is unknown, of the wrong type, or impossible together with another."""


class DataError(LMError):
    """The text or tokenizer a config points at cannot be used: missing, empty or malformed."""


ATTENTION_KERNELS = ("sdpa", "flex", "math")
ROPE_SCALINGS = ("none", "pi", "ntk", "yarn")
"""RoPE context extensions (``lm.position``): none, Position Interpolation, NTK-aware, YaRN."""


def value_text(value: Any) -> str:
    """A config value as YAML writes it inline: lists as ``[a, b, ...]``, None as ``null``,
    booleans as ``true``/``false``, the rest as text."""
    if isinstance(value, list):
        return "[" + ", ".join(map(value_text, value)) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def split_values(text: str) -> list[str]:
    """``"rope,[rope,none],alibi"`` -> ``["rope", "[rope,none]", "alibi"]``: values separated by
    the commas outside brackets, stripped; empty ones dropped."""
    values, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth <= 0:
            values.append(text[start:i].strip())
            start = i + 1
    return [v for v in values if v]


def _choice(section: str, name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{section}.{name}: {value!r} is not one of {', '.join(allowed)}")


def parse_rope_scaling(text: str | None, key: str = "model.rope_scaling") -> tuple[str, float]:
    """``"pi:4"`` -> ``("pi", 4.0)``; None or ``"none"`` -> ``("none", 1.0)``. ``key`` names the
    setting in the one-line error (a config key or a flag)."""
    if text is None or text.strip() == "none":
        return "none", 1.0
    allowed = "none, " + ", ".join(f"{m}:FACTOR" for m in ROPE_SCALINGS[1:])
    method, colon, factor_text = text.strip().partition(":")
    if method not in ROPE_SCALINGS[1:]:
        raise ConfigError(f"{key}: {text!r} is not one of {allowed} (for example yarn:4)")
    if not colon:
        raise ConfigError(f"{key}: {text!r} needs a factor, for example {method}:4")
    try:
        factor = float(factor_text)
    except ValueError:
        raise ConfigError(f"{key}: the factor of {text!r} is not a number") from None
    if not (math.isfinite(factor) and factor >= 1.0):
        raise ConfigError(
            f"{key}: the factor of {text!r} must be a number >= 1 (how many times the trained "
            "context to reach)"
        )
    return method, factor


def _positive(section: str, obj: Any, *names: str, allow_zero: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None:
            continue
        if value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise ConfigError(f"{section}.{name}: must be {bound}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """The network: a decoder-only transformer as in the notes."""

    vocab_size: int | None = None
    """Number of token ids; filled in from the tokenizer when training from a config."""
    context_length: int = 256
    """Longest sequence the model is trained on (L in the notes)."""
    n_layer: int = 4
    """Number of transformer blocks."""
    n_head: int = 4
    """Attention heads per block; each has width d_model / n_head (d_k in the notes)."""
    d_model: int = 128
    """Width of the residual stream (d in the notes)."""
    d_ff: int | None = None
    """Hidden width of the token-wise MLP; default 4 * d_model."""
    position: str | list[str] = "rope"
    """Position scheme: rope | sinusoidal | learned | alibi | t5 | kerple | fire | none; or one
    per layer, [rope, rope, rope, none], a list ending in ... repeating over the layers ([rope,
    rope, rope, none, ...]: no position every fourth layer). sinusoidal and learned add to the
    embeddings, below every layer at once: never per layer."""
    scale_embeddings: bool = True
    """sinusoidal only: x_l = sqrt(d) E[w_l] + p_l (Vaswani et al.); false: the notes' E[w_l] + p_l,
    which trains far worse (README, "Compare position schemes")."""
    rope_base: float = 10000.0
    """Base of RoPE's angles: theta_i = rope_base^(-2i/d_k)."""
    rope_scaling: str | None = None
    """RoPE context extension: none | pi:FACTOR | ntk:FACTOR | yarn:FACTOR (lm/position.py)."""
    rope_fraction: float = 1.0
    """Fraction of each head's feature pairs that RoPE rotates (the rest are left unrotated)."""
    rope_original_context: int | None = None
    """The context RoPE was first trained at (YaRN's L); default context_length."""
    t5_buckets: int = 32
    """t5 only: buckets of query-key distance, one learned bias each per head (Raffel et al.)."""
    t5_max_distance: int = 128
    """t5 only: the distance from which every longer one shares the last bucket."""
    fire_width: int = 32
    """fire only: hidden width of FIRE's MLP of the normalised distance (Li et al.: 32)."""
    fire_threshold: float = 512.0
    """fire only: the threshold L (its start; learned) below which queries are normalised by
    psi(L) instead of psi(their position) (the paper's code: 512)."""
    random_positions: int | None = None
    """Training only: each sequence reads a sorted random draw of distinct positions from
    [0, M) instead of 0..L-1 (Ruoss et al. 2023), M >= context_length; evaluation and sampling
    read 0..L-1. null: off."""
    dropout: float = 0.0
    """Dropout on attention weights and residual branches during training."""
    attention: str = "sdpa"
    """Attention kernel: sdpa (fused; masks and ALiBi via FlexAttention when compiled) | flex
    (FlexAttention always) | math (the notes' explicit softmax). See lm/attention.py."""
    bias: bool = False
    """Biases in linear layers and norms (the notes omit them)."""
    tie_embeddings: bool = True
    """Share the token embedding matrix with the output head."""
    norm_eps: float = 1e-5
    """Epsilon of LayerNorm."""

    def __post_init__(self) -> None:
        s = "model"
        _positive(s, self, "vocab_size", "context_length", "n_layer", "n_head", "d_model", "d_ff")
        _positive(s, self, "rope_base", "norm_eps")
        self._check_position()
        _choice(s, "attention", self.attention, ATTENTION_KERNELS)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout: must be in [0, 1), got {self.dropout!r}")
        if self.attention == "flex" and self.dropout:
            raise ConfigError(
                "model.attention: flex has no dropout on attention weights; use sdpa, or "
                "model.dropout: 0"
            )
        if self.d_model % self.n_head:
            raise ConfigError(
                f"model.n_head: d_model={self.d_model} is not divisible by n_head={self.n_head}"
            )
        if "rope" in self.layer_positions and self.head_dim % 2:
            raise ConfigError(
                f"model.position: rope rotates feature pairs, so the head width "
                f"d_model/n_head={self.head_dim} must be even"
            )
        if self.position != "sinusoidal" and not self.scale_embeddings:
            raise ConfigError(
                f"model.scale_embeddings: applies to position: sinusoidal only (this model uses "
                f"{self.position})"
            )
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ConfigError(
                f"model.position: sinusoidal needs an even d_model, got {self.d_model}"
            )
        self._check_rope()
        self._check_scheme_keys()
        self._check_random_positions()

    def _check_random_positions(self) -> None:
        M = self.random_positions
        if M is None:
            return
        if self.context_length > M:
            raise ConfigError(
                f"model.random_positions: {M} is below model.context_length="
                f"{self.context_length}; training draws a sequence's positions from [0, M), so "
                "M must be at least the longest sequence"
            )
        if set(self.layer_positions) == {"none"}:
            raise ConfigError("model.random_positions: position: none reads no positions")

    def _check_position(self) -> None:
        """One scheme, or one per layer (read back as ``layer_positions``)."""
        from lm.position import POSITIONS, SCHEMES  # the registry (lm.position imports this)

        if isinstance(self.position, str):
            _choice("model", "position", self.position, POSITIONS)
            return
        text = value_text(self.position)
        names = list(self.position)
        repeat = names[-1:] == ["..."]
        names = names[:-1] if repeat else names
        if not names:
            raise ConfigError(
                f"model.position: {text} names no scheme; give one per layer, for example "
                "[rope, rope, rope, none]"
            )
        for name in names:
            if name == "...":
                raise ConfigError(f"model.position: {text}: ... may only end the list")
            _choice("model", "position", name, POSITIONS)
            if SCHEMES[name].acts_on == "embeddings":
                raise ConfigError(
                    f"model.position: {text}: {name} adds to the embeddings, below every layer "
                    f"at once, and cannot be chosen per layer (write position: {name})"
                )
        if repeat and self.n_layer % len(names):
            raise ConfigError(
                f"model.position: {text} repeats {len(names)} schemes, which does not fill "
                f"n_layer={self.n_layer} layers"
            )
        if not repeat and len(names) != self.n_layer:
            raise ConfigError(
                f"model.position: {text} names {len(names)} schemes for n_layer={self.n_layer} "
                "layers; give one per layer, or end the list with ... to repeat it"
            )

    def _check_scheme_keys(self) -> None:
        """T5's and FIRE's keys, each within its range. Like ``rope_base``, they are read only by
        a model that uses their scheme, so that one config can hold them for a sweep over
        ``model.position``."""
        _positive("model", self, "fire_width", "fire_threshold")
        if self.t5_buckets < 2:
            raise ConfigError(f"model.t5_buckets: must be at least 2, got {self.t5_buckets}")
        if self.t5_max_distance <= self.t5_buckets // 2:
            raise ConfigError(
                f"model.t5_max_distance: must be above t5_buckets/2 = {self.t5_buckets // 2} "
                f"(the distances with a bucket each), got {self.t5_max_distance}"
            )

    def _check_rope(self) -> None:
        """RoPE's own keys: set only on a RoPE model, each within its range. ``rope_scaling`` is
        parsed here, once, into ``rope_method`` and ``rope_factor``."""
        object.__setattr__(self, "_rope_scaling", parse_rope_scaling(self.rope_scaling))
        _positive("model", self, "rope_original_context")
        if not 0.0 < self.rope_fraction <= 1.0:
            raise ConfigError(f"model.rope_fraction: must be in (0, 1], got {self.rope_fraction!r}")
        if "rope" not in self.layer_positions:
            for name, default in (("rope_fraction", 1.0), ("rope_original_context", None)):
                if getattr(self, name) != default:
                    raise ConfigError(
                        f"model.{name}: applies to position: rope only (this model uses "
                        f"{self.position_text})"
                    )
            if self.rope_method != "none":
                raise ConfigError(
                    f"model.rope_scaling: {self.rope_scaling} extends RoPE; this model uses "
                    f"position: {self.position_text}"
                )
            return
        pairs = self.rope_fraction * self.head_dim / 2
        if round(pairs) < 1 or abs(pairs - round(pairs)) > 1e-6:
            raise ConfigError(
                f"model.rope_fraction: {self.rope_fraction} of the {self.head_dim // 2} pairs of "
                f"a head is {pairs:g} pairs; choose a fraction that gives a whole number >= 1"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def layer_positions(self) -> tuple[str, ...]:
        """Each layer's position scheme, ``n_layer`` names (a list ending in ``...`` repeated)."""
        if isinstance(self.position, str):
            return (self.position,) * self.n_layer
        names = [name for name in self.position if name != "..."]
        return tuple(names * (self.n_layer // len(names)))

    @property
    def position_range(self) -> int:
        """How many positions training reads: ``0 .. position_range - 1``."""
        return self.random_positions or self.context_length

    @property
    def position_text(self) -> str:
        """``position`` as a reader writes it: ``rope``, ``[rope, rope, rope, none, ...]``."""
        return value_text(self.position)

    @property
    def rope_method(self) -> str:
        """The context extension's method: none | pi | ntk | yarn."""
        return self._rope_scaling[0]

    @property
    def rope_factor(self) -> float:
        """The context extension's factor s (1.0 for none)."""
        return self._rope_scaling[1]

    @property
    def rope_pairs(self) -> int:
        """How many of each head's feature pairs RoPE rotates (the first ones)."""
        return round(self.rope_fraction * self.head_dim / 2)

    @property
    def rope_context(self) -> int:
        """The trained context L that YaRN's ramp measures wavelengths against."""
        return self.rope_original_context or self.context_length

    @property
    def ff_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model


DATA_MODES = ("packed", "padded")
SPLIT_BY = ("file", "line", "paragraph")
VAL_SPLITS = ("tail", "random")
BUILTIN_TOKENIZERS = ("char", "byte", "bpe")
BUILTINS = ("python-docs", "copy", "reverse", "addition")
"""``data.source: builtin:NAME``: CPython's help topics, or a generated task (lm/tasks.py)."""


@dataclass(frozen=True)
class DataConfig:
    """Where text comes from, how it becomes token ids, and how ids become batches."""

    source: str = "builtin:python-docs"
    """A .txt/.jsonl/.json/.parquet file, folder or glob; a Hub dataset id; builtin:python-docs;
    a generated task: builtin:copy | builtin:reverse | builtin:addition (lm/tasks.py)."""
    config_name: str | None = None
    """Hub dataset configuration (for example wikitext-2-raw-v1)."""
    split: str = "train"
    """Hub split to train on."""
    streaming: bool = False
    """Stream a Hub dataset instead of downloading it whole (use with max_documents)."""
    max_documents: int | None = None
    """Use only the first N documents of the source."""
    split_by: str = "file"
    """For .txt sources, one document per: file | line | paragraph (blank-line separated)."""
    text_field: str = "text"
    """Field holding the text in .jsonl/.json/.parquet and Hub sources."""
    tokenizer: str = "char"
    """char | byte | bpe | a path to a tokenizer.json."""
    vocab_size: int | None = None
    """Vocabulary size to train a bpe tokenizer to (specials included)."""
    mode: str = "packed"
    """packed (documents joined into one stream, random windows) | padded (one doc per row)."""
    document_mask: bool = False
    """In packed mode, keep attention inside each document and restart positions at each."""
    val_fraction: float = 0.1
    """Fraction held out for validation when the source has no validation split."""
    val_split: str = "tail"
    """How to hold it out: tail (the end of the source) | random (documents chosen by seed)."""
    seed: int = 1337
    """Seed of the random validation split and of a builtin task's examples."""
    task_lengths: str = "1-20"
    """builtin tasks: lengths of the training examples, LOW-HIGH, each drawn uniformly (symbols
    of the input, or digits of each operand)."""
    task_eval_lengths: str = "1-40"
    """builtin tasks: the lengths exact-match accuracy is measured at (lm eval, lm compare)."""
    task_examples: int = 20000
    """builtin tasks: training examples generated (val_fraction of them held out)."""
    task_eval_examples: int = 100
    """builtin tasks: examples per evaluation length."""
    num_proc: int | None = None
    """Processes for tokenizing; default: the CPU count, capped at 8."""
    cache_dir: str | None = None
    """Where tokenized data is cached; default $LM_CACHE or ~/.cache/lm."""

    def __post_init__(self) -> None:
        s = "data"
        _choice(s, "mode", self.mode, DATA_MODES)
        _choice(s, "split_by", self.split_by, SPLIT_BY)
        _choice(s, "val_split", self.val_split, VAL_SPLITS)
        _positive(s, self, "max_documents", "num_proc", "vocab_size")
        if not self.source.strip():
            raise ConfigError("data.source: must name a file, folder, glob, Hub id or builtin:")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction: must be in (0, 1), got {self.val_fraction!r}")
        if self.tokenizer not in BUILTIN_TOKENIZERS and not self.tokenizer.endswith(".json"):
            raise ConfigError(
                f"data.tokenizer: {self.tokenizer!r} is not char, byte, bpe or a path to a "
                "tokenizer.json"
            )
        if self.tokenizer == "bpe" and self.vocab_size is None:
            raise ConfigError("data.vocab_size: required with tokenizer: bpe (for example 1024)")
        if self.document_mask and self.mode != "packed":
            raise ConfigError("data.document_mask: only applies to mode: packed")
        self._check_task()

    def _check_task(self) -> None:
        """A builtin: that exists; a task's own keys set only for a task, each within range."""
        from lm.tasks import TASKS, parse_lengths, task_of

        source = self.source.strip()
        if source.startswith("builtin:") and source.removeprefix("builtin:") not in BUILTINS:
            known = ", ".join(f"builtin:{b}" for b in BUILTINS)
            raise ConfigError(f"data.source: unknown builtin {source!r} (builtins: {known})")
        keys = ("task_lengths", "task_eval_lengths", "task_examples", "task_eval_examples")
        if task_of(source) is None:
            for key in keys:
                if getattr(self, key) != DataConfig.__dataclass_fields__[key].default:
                    tasks = ", ".join(f"builtin:{t}" for t in TASKS)
                    raise ConfigError(f"data.{key}: applies to the builtin tasks ({tasks}) only")
            return
        _positive("data", self, "task_eval_examples")
        if self.task_examples < 2:
            raise ConfigError(
                f"data.task_examples: {self.task_examples}; at least 2 (one to train on, one to "
                "validate on)"
            )
        try:
            for key in keys[:2]:
                parse_lengths(getattr(self, key), f"data.{key}")
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def task_ranges(self) -> tuple[range, range]:
        """A task's training and evaluation lengths."""
        from lm.tasks import parse_lengths

        return (
            parse_lengths(self.task_lengths, "data.task_lengths"),
            parse_lengths(self.task_eval_lengths, "data.task_eval_lengths"),
        )


SCHEDULES = ("cosine", "linear", "constant", "wsd")
OPTIMIZERS = ("adamw", "muon")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "fp32", "bf16", "fp16")
ON_NONFINITE = ("stop", "skip")


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation loop, evaluation, checkpoints and hardware."""

    max_steps: int = 1000
    """Optimizer steps to train for."""
    batch_size: int = 32
    """Global sequences per optimizer step, whatever the process count."""
    micro_batch_size: int | None = None
    """Sequences per process per forward pass; accumulation = batch_size / (this x processes)."""
    grad_accum: int = 1
    """Without micro_batch_size: micro-batches per optimizer step on each process."""
    lr: float = 1e-3
    """Peak learning rate."""
    min_lr: float = 1e-4
    """Learning rate at the end of the decay."""
    warmup_steps: int = 100
    """Linear warmup from 0 to lr."""
    schedule: str = "cosine"
    """After warmup: cosine | linear | constant | wsd (constant, then linear decay)."""
    decay_fraction: float = 0.2
    """For wsd: fraction of max_steps spent decaying at the end."""
    optimizer: str = "adamw"
    """adamw | muon (Muon for hidden matrices, AdamW for embeddings, head and norms)."""
    muon_lr: float = 0.02
    """Peak learning rate of Muon's hidden matrices (the schedule scales it like lr)."""
    weight_decay: float = 0.1
    """Decoupled weight decay, applied to matrices only."""
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    eval_every: int = 250
    """Evaluate every N steps (and at the end); 0 disables periodic evaluation."""
    eval_steps: int | None = None
    """Batches per evaluation; default: the whole validation split."""
    eval_batch_size: int | None = None
    """Sequences per evaluation batch; default: the training micro-batch (of one process)."""
    checkpoint_every: int = 500
    """Save a checkpoint every N steps (and at the end); 0: only at the end."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep."""
    log_every: int = 10
    """Write a training line to metrics.jsonl every N steps."""
    seed: int = 1337
    device: str = "auto"
    """auto (cuda, then mps, then cpu) | cpu | cuda | mps."""
    dtype: str = "auto"
    """auto | fp32 | bf16 | fp16 (autocast; fp16 adds a gradient scaler)."""
    threads: int | None = None
    """CPU threads of this run's math; default: torch's (the cores). The numbers do not depend
    on it: a run on one thread equals the same run on two, bit for bit (fp32)."""
    compile: bool | None = None
    """torch.compile the model: true | false; left out (null), it compiles on CUDA only."""
    parallel: str = "ddp"
    """With several processes: ddp (a model copy on each) | fsdp (weights, gradients and
    optimizer state sharded over them, for models beyond one GPU's memory)."""
    on_nonfinite: str = "stop"
    """On a NaN/inf loss or gradient: stop (keep the last good checkpoint) | skip the update."""
    on_checkpoint_error: str = "stop"
    """When a checkpoint cannot be written (disk full, no permission): stop | continue."""
    target_loss: float | None = None
    """Stop as soon as an evaluation reaches this validation loss."""
    tensorboard: bool | None = None
    """TensorBoard event files in the run directory: true | false; null (default): if installed."""
    dist_timeout_s: float = 3600.0
    """Under torchrun: seconds a process waits for the others (first data preparation included)."""

    def __post_init__(self) -> None:
        s = "train"
        _choice(s, "schedule", self.schedule, SCHEDULES)
        _choice(s, "optimizer", self.optimizer, OPTIMIZERS)
        _choice(s, "device", self.device, DEVICES)
        _choice(s, "dtype", self.dtype, DTYPES)
        _choice(s, "parallel", self.parallel, ("ddp", "fsdp"))
        if self.parallel == "fsdp" and self.dtype == "fp16":
            # FSDP2's mixed precision has no gradient scaler to pair with fp16's narrow range.
            raise ConfigError(
                "train.dtype: fp16 cannot run sharded (train.parallel: fsdp); use bf16 or fp32, "
                "or parallel: ddp"
            )
        if self.parallel == "fsdp" and self.optimizer == "muon":
            # Muon orthogonalises whole matrices; FSDP gives each process a slice of rows.
            raise ConfigError(
                "train.optimizer: muon works on whole matrices and cannot run sharded "
                "(train.parallel: fsdp); use adamw, or parallel: ddp"
            )
        if self.compile is not None and not isinstance(self.compile, bool):  # (from Python)
            raise ConfigError(f"train.compile: expected true, false or None, got {self.compile!r}")
        _choice(s, "on_nonfinite", self.on_nonfinite, ON_NONFINITE)
        _choice(s, "on_checkpoint_error", self.on_checkpoint_error, ("stop", "continue"))
        _positive(s, self, "max_steps", "batch_size", "grad_accum", "lr", "keep_checkpoints")
        _positive(s, self, "micro_batch_size", "dist_timeout_s", "threads")
        _positive(s, self, "muon_lr")
        _positive(s, self, "eval_steps", "eval_batch_size", "log_every")
        _positive(s, self, "warmup_steps", "min_lr", "weight_decay", "grad_clip", allow_zero=True)
        _positive(s, self, "eval_every", "checkpoint_every", allow_zero=True)
        if self.min_lr > self.lr:
            raise ConfigError(f"train.min_lr: {self.min_lr} is above train.lr={self.lr}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"train.{name}: must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ConfigError(f"train.decay_fraction: must be in (0, 1], got {self.decay_fraction}")
        if self.micro_batch_size is not None and self.grad_accum != 1:
            raise ConfigError(
                "train.grad_accum: set micro_batch_size or grad_accum, not both "
                "(accumulation follows from batch_size / (micro_batch_size x processes))"
            )
        if self.batch_size % self.grad_accum:
            raise ConfigError(
                f"train.grad_accum: batch_size={self.batch_size} is not divisible by "
                f"grad_accum={self.grad_accum}"
            )
        self.accumulation(1)  # a config that cannot run even on one process is refused at load

    def accumulation(self, processes: int) -> int:
        """Micro-batches per optimizer step on each of ``processes``; a ConfigError if the
        numbers do not divide."""
        micro = self.micro_batch(processes)
        if micro * processes > self.batch_size:
            each = f" x {processes} processes" if processes > 1 else ""
            raise ConfigError(
                f"train.micro_batch_size: {micro}{each} is more than train.batch_size "
                f"{self.batch_size}, the global batch of a step; set micro_batch_size to at most "
                f"{max(self.batch_size // processes, 1)}"
            )
        if self.batch_size % (micro * processes):
            raise ConfigError(
                f"train.batch_size: {self.batch_size} is not divisible by micro_batch_size "
                f"{micro} x {processes} process(es)"
            )
        return self.batch_size // (micro * processes)

    def eval_batch(self) -> int:
        """Sequences per evaluation forward: the training micro-batch (as one process has it,
        so that the batches evaluated do not depend on the process count) unless
        eval_batch_size says otherwise; evaluation memory never grows with batch_size."""
        return self.eval_batch_size or self.micro_batch(1)

    def micro_batch(self, processes: int) -> int:
        """Sequences per process per forward pass."""
        if self.micro_batch_size is not None:
            return self.micro_batch_size
        parts = self.grad_accum * processes
        if self.batch_size % parts:
            raise ConfigError(
                f"train.batch_size: {self.batch_size} is not divisible by grad_accum "
                f"{self.grad_accum} x {processes} process(es) (or set train.micro_batch_size)"
            )
        return self.batch_size // parts


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        from lm.tasks import task_of, tokens

        task = task_of(self.data.source)
        if task is None:
            return
        C = self.model.context_length
        keys = ("task_lengths", "task_eval_lengths")
        for key, lengths in zip(keys, self.data.task_ranges(), strict=True):
            longest = tokens(task, lengths[-1])
            if longest - 1 > C:  # its inputs: every token but the last target
                raise ConfigError(
                    f"data.{key}: {task} at length {lengths[-1]} makes examples of {longest} "
                    f"tokens with <eod>, more than model.context_length={C} + 1; raise the "
                    "context or shorten the lengths"
                )

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def replace(self, **sections: Any) -> Config:
        return dataclasses.replace(self, **sections)


SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}

_TYPE_WORDS = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    list[str]: "a list of names",
}


_OLD_SWITCH_WORDS = {"true": True, "false": False, "auto": None}


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against the annotation ``hint``; ints are accepted where floats are."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise ConfigError(f"{key}: must not be empty")
    for t in options:
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{key}: must be a finite number, got {value!r}")
            return float(value)
        if t is str and isinstance(value, str):
            return value
        if t == list[str] and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
    # Configs written before the optional switches (compile, tensorboard) became true | false |
    # null stored them as the words "true", "false" and "auto"; those runs still load.
    if bool in options and type(None) in options and value in _OLD_SWITCH_WORDS:
        return _OLD_SWITCH_WORDS[value]
    wanted = " or ".join(_TYPE_WORDS[t] for t in options if t in _TYPE_WORDS)
    # Every optional key defaults to None, so null and leaving the key out are the same.
    default = " (or leave it out: null)" if type(None) in options else ""
    return _raise(f"{key}: expected {wanted}, got {value!r}{default}")


def _raise(message: str) -> Any:
    raise ConfigError(message)


def _name(key: Any) -> str:
    """A key as it can be shown in one line: plain names as they are, anything odd quoted."""
    text = str(key)
    return text if text.isprintable() and text.strip() == text and text else repr(key)


def _build_section(name: str, values: Any) -> Any:
    cls = SECTIONS[name]
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{name}: expected a mapping of keys, got {values!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {name}.{close[0]}?)" if close else ""
            raise ConfigError(f"{name}.{_name(key)}: unknown key{hint}")
        kwargs[key] = _coerce(f"{name}.{key}", value, hints[key])
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # a check comparing a value of an odd type
        raise ConfigError(f"{name}: {e}") from None


def config_from_dict(raw: Any) -> Config:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("config: expected a mapping with sections model, data, train")
    for key in raw:
        if key not in SECTIONS:
            raise ConfigError(f"{_name(key)}: unknown section (allowed: {', '.join(SECTIONS)})")
    return Config(**{name: _build_section(name, raw.get(name)) for name in SECTIONS})


def parse_overrides(pairs: list[str], flag: str = "--set") -> dict[str, dict[str, Any]]:
    """``["train.lr=3e-4", "model.position=alibi"]`` -> nested dict; the last of a key wins."""
    nested: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"{flag} {pair!r}: expected KEY=VALUE, for example train.lr=3e-4")
        key, text = pair.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) != 2 or parts[0] not in SECTIONS or not parts[1]:
            raise ConfigError(
                f"{flag} {key!r}: expected SECTION.KEY with SECTION one of {', '.join(SECTIONS)}"
            )
        if not parts[1].isidentifier():
            raise ConfigError(f"{flag} {key!r}: {_name(parts[1])} is not a config key name")
        nested.setdefault(parts[0], {})[parts[1]] = parse_value(text)
    return nested


def parse_value(text: str) -> Any:
    """A command-line value read as YAML (``3e-4`` is a number, ``true`` a bool, ``~`` None)."""
    try:
        value = yaml.load(text, Loader=_Loader) if text.strip() else text
    except yaml.YAMLError:
        return text
    # YAML 1.1 reads "3e-4" as a string; accept it as the number a user meant.
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


def merge(base: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in overrides.items():
        current = merged.get(section)
        if current is None:
            current = {}
        if not isinstance(current, dict):
            raise ConfigError(f"{section}: expected a mapping of keys, got {current!r}")
        merged[section] = {**current, **values}
    return merged


class _Loader(yaml.SafeLoader):
    """Safe YAML that reads numbers as users write them: YAML 1.1 (PyYAML) takes ``3e-4`` and
    ``1E5`` for strings, since its floats need a dot and a signed exponent."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """Where and what: PyYAML's ``problem`` (its message's first line is often only the context,
    "while scanning for the next token"), with a tab named as the indentation mistake it is."""
    mark = getattr(e, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
    if "'\\t'" in problem:
        problem = "a tab, which YAML does not take for indentation: indent with spaces"
    return f"{where}: {problem}"


def read_yaml(path: str | Path) -> Any:
    """Safe YAML only: a Python tag (``!!python/object``) is refused, never constructed."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a config file (give a YAML file in it)")
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not a valid safe YAML config{_yaml_problem(e)}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """The config in ``path`` (defaults when None) with ``KEY=VALUE`` overrides applied."""
    raw = read_yaml(path) if path is not None else {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with sections model, data, train")
    return config_from_dict(merge(raw, parse_overrides(overrides or [])))


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")


def flatten(config: Config) -> dict[str, Any]:
    """Every key of ``config`` by its dotted name (``model.position``), in declaration order."""
    return {f"{s}.{k}": v for s, values in config.to_dict().items() for k, v in values.items()}


def config_diff(a: Config, b: Config) -> dict[str, tuple[Any, Any]]:
    """The keys whose values differ between ``a`` and ``b``: dotted name -> (a's, b's), in
    declaration order (model, data, train), so the first entry is the first key a reader meets."""
    flat_a, flat_b = flatten(a), flatten(b)
    return {key: (flat_a[key], flat_b[key]) for key in flat_a if flat_a[key] != flat_b[key]}
