"""The three sections of a config as typed, frozen dataclasses, each checked once when it is
built: ``ModelConfig`` (the network), ``DataConfig`` (text, tokens, batches), ``TrainConfig``
(the loop and the hardware), and ``Config``, which holds them and checks what spans two. A
wrong value raises :class:`ConfigError` with one line that names the key and what is allowed.
Every field's docstring is its documentation (docs/configuration.md is generated from them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lm.config.checks import ModelChecks, choice, per_layer, positive
from lm.config.errors import ConfigError
from lm.config.names import (
    BUILTIN_TOKENIZERS,
    BUILTINS,
    DATA_MODES,
    DEVICES,
    DTYPES,
    KERNELS,
    ON_NONFINITE,
    OPTIMIZERS,
    SCHEDULES,
    SPLIT_BY,
    VAL_SPLITS,
    SchemeRow,
    row,
    task_of,
)
from lm.config.tasks import at_context, check_task, check_task_fits
from lm.config.values import parse_task_lengths, shown, value_text


@dataclass(frozen=True)
class ModelConfig(ModelChecks):
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
    """Hidden width of the token-wise MLP; default 4 * d_model, and for swiglu 2/3 * 4 * d_model
    rounded up to a multiple of 8 (Llama's: the GELU MLP's parameter count in three matrices)."""
    n_kv_head: int | None = None
    """Key and value heads (grouped-query attention, Ainslie et al. 2023): query head h reads
    key/value head h // (n_head / n_kv_head); n_head must be a multiple of it. 1: multi-query
    attention (Shazeer 2019); default n_head: one key/value head per query head. The KV cache
    holds n_kv_head heads."""
    norm: str = "layernorm"
    """The block's norms: layernorm ((x - mean) / sqrt(var + eps) * g + b; Ba et al. 2016) |
    rmsnorm (x / sqrt(mean(x^2) + eps) * g, no mean and no bias; Zhang & Sennrich 2019)."""
    mlp: str = "gelu"
    """The token-wise MLP: gelu (W_2 GELU(W_1 x), GPT-2) | swiglu (W_2 (SiLU(W_1 x) * W_3 x),
    Shazeer 2020, Llama) | relu2 (W_2 ReLU(W_1 x)^2, So et al. 2021, nanochat) | none (no MLP
    and no second norm: an attention-only block, x + Attn(LN(x)); Elhage et al. 2021)."""
    qk_norm: bool = False
    """RMSNorm over each head's query and key, q / sqrt(mean(q^2) + eps) * g_q (k alike), with a
    learned gain per feature of a head, before any rotation or score bias (Qwen3, OLMo 2;
    Henry et al. 2020, Dehghani et al. 2023)."""
    smear_keys: bool = False
    """Smeared keys (Olsson et al. 2022): each key head h mixes every key with its document's
    previous token's key, k'_t = sigmoid(a_h) k_t + (1 - sigmoid(a_h)) k_(t-1), a_h learned from
    0; before any rotation; a document's first token keeps its own key (docs/block.md)."""
    position: str | list[str] = "rope"
    """Position scheme, one of "Position schemes" below (their rows in lm/config/names.py); or
    one per layer, [rope, rope, rope, none], a list ending in ... repeating over the layers ([rope,
    rope, rope, none, ...]: no position every fourth layer). Schemes that add to the embeddings
    (sinusoidal, learned) act below every layer at once: never per layer."""
    scale_embeddings: bool = True
    """Scale the token embedding: x_l = sqrt(d) E[w_l] + p_l (Vaswani et al.); false: the notes'
    E[w_l] + p_l, which trains far worse (docs/compare.md)."""
    rope_base: float = 10000.0
    """Base of RoPE's angles: theta_i = rope_base^(-2i/d_k)."""
    rope_scaling: str | None = None
    """RoPE context extension: none | pi:FACTOR | ntk:FACTOR | yarn:FACTOR (lm/model/schemes/)."""
    rope_fraction: float = 1.0
    """Fraction of each head's feature pairs that RoPE rotates (the rest are left unrotated)."""
    rope_original_context: int | None = None
    """The context RoPE was first trained at (YaRN's L); default context_length."""
    rope_p: float = 1.0
    """p-RoPE (Barbero et al. 2025): the fraction of each head's pairs that rotate, the fastest
    ones, at the notes' frequencies; the slowest are left unrotated (rope_fraction instead
    re-spaces the frequencies over the pairs it rotates, as GPT-NeoX does)."""
    xpos_scale_base: float = 512.0
    """The B of xPos's decay zeta_i^((l - j)/B) per pair (Sun et al.: 512)."""
    t5_buckets: int = 32
    """Buckets of query-key distance, one learned bias each per head (Raffel et al.)."""
    t5_max_distance: int = 128
    """The distance from which every longer one shares the last bucket."""
    fire_width: int = 32
    """Hidden width of FIRE's MLP of the normalised distance (Li et al.: 32)."""
    fire_threshold: float = 512.0
    """The threshold L (its start; learned) below which queries are normalised by psi(L)
    instead of psi(their position) (the paper's code: 512)."""
    cope_max: int | None = None
    """CoPE's position embeddings e[0] .. e[cope_max - 1] (counted positions are clamped below
    it); default context_length + 1, as the paper's code."""
    dape_bias: str = "kerple"
    """The static bias B whose scores DAPE's MLP reads: kerple | alibi (Zheng et al.)."""
    random_positions: int | None = None
    """Training only: each sequence reads a sorted random draw of distinct positions from
    [0, M) instead of 0..L-1 (Ruoss et al. 2023), M >= context_length; evaluation and sampling
    read 0..L-1. null: off."""
    random_positions_eval: bool = False
    """With random_positions: draw them at evaluation too, at every forward pass (lm eval, a
    task's accuracy, validation; decoding then runs without a KV cache), as Ruoss et al.'s code
    does, from train.seed, the split, the length and the batch (the same numbers every time, for
    one evaluation batch size); false: evaluation and sampling read 0..L-1."""
    dropout: float = 0.0
    """Dropout on attention weights and residual branches during training."""
    normalize: str = "softmax"
    """How scores become attention weights: softmax (the notes) | ssmax (Scalable-Softmax, s_h
    log n times the scores, n the keys a query reads, s_h learned; Nakanishi 2025) |
    stick_breaking (A_lj = sigma(s_lj) times the product of 1 - sigma(s_lk) over the keys k
    between j and l; Tan et al. 2025; with position: none, as the paper)."""
    window: int | list | None = None
    """Sliding-window attention: a query reads at most the last W keys, itself included. One W for
    every layer; or one per layer, [64, 64, 64, null] (null: every key); or a list ending in ...
    repeated over the layers, [512, 512, null, ...] (Gemma's local and global layers)."""
    kernel: str = "auto"
    """How softmax(S + M) V is computed: sdpa (PyTorch's fused kernel; FlexAttention for masks
    and biases in a model compiled for a GPU) | flex | math (the notes' formula written out) |
    auto (math where the dtype is bf16 on a CPU with bf16 instructions, at width 128 or more;
    else sdpa: lm.runtime.device.auto_rule; config.yaml records the one that ran).
    lm/model/kernels.py."""
    bias: bool = False
    """Biases in linear layers and norms (the notes omit them)."""
    tie_embeddings: bool = True
    """Share the token embedding matrix with the output head."""
    norm_eps: float = 1e-5
    """Epsilon of the norms (LayerNorm's or RMSNorm's, and QK-norm's)."""

    def __post_init__(self) -> None:
        s = "model"
        positive(s, self, "vocab_size", "context_length", "n_layer", "n_head", "d_model", "d_ff")
        positive(s, self, "rope_base", "norm_eps")
        self._check_position()
        # Each layer's scheme, n_layer names (a list ending in ... repeated): set once, read by
        # every forward pass.
        object.__setattr__(self, "layer_positions", per_layer(self.position, self.n_layer))
        # The rows of its layers' schemes (``lm.config.names.row``), each once, in layer order:
        # what the code asks of a scheme, never its name.
        rows: tuple[SchemeRow, ...] = tuple(map(row, dict.fromkeys(self.layer_positions)))
        object.__setattr__(self, "rows", rows)
        choice(s, "kernel", self.kernel, KERNELS)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout: must be in [0, 1), got {self.dropout!r}")
        if self.kernel == "flex" and self.dropout:
            raise ConfigError(
                "model.kernel: flex has no dropout on attention weights; use sdpa, or "
                "model.dropout: 0"
            )
        if self.d_model % self.n_head:
            raise ConfigError(
                f"model.n_head: d_model={self.d_model} is not divisible by n_head={self.n_head}"
            )
        self._check_widths()
        self._check_block()
        self._check_rope()
        self._check_scheme_keys()
        self._check_random_positions()
        self._check_random_positions_eval()
        self._check_normalize()
        self._check_window()
        # Each layer's window, n_layer of them (None: every key).
        object.__setattr__(self, "layer_windows", per_layer(self.window, self.n_layer))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def cope_positions(self) -> int:
        """How many position embeddings CoPE has."""
        return self.cope_max or self.context_length + 1

    @property
    def rope_kept_pairs(self) -> int:
        """How many of each head's fastest pairs p-RoPE rotates (all, by default)."""
        return round(self.rope_p * self.head_dim / 2)

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
    def kv_heads(self) -> int:
        """Key and value heads: ``n_kv_head``, or ``n_head`` when not set."""
        return self.n_kv_head or self.n_head

    @property
    def ff_dim(self) -> int:
        """The MLP's hidden width: ``d_ff``; else 4 d, or for SwiGLU 2/3 of it rounded up to a
        multiple of 8, so that its three matrices hold about the two of the GELU MLP."""
        if self.d_ff is not None:
            return self.d_ff
        if self.mlp == "swiglu":
            return 8 * -(-self.d_model // 3)  # 8d/3 rounded up to a multiple of 8: 8 ceil(d/3)
        return 4 * self.d_model


@dataclass(frozen=True)
class DataConfig:
    """Where text comes from, how it becomes token ids, and how ids become batches."""

    source: str = "builtin:python-docs"
    """A .txt/.jsonl/.json/.parquet file, folder or glob; a Hub dataset id; builtin:python-docs;
    builtin:repeats (random sequences each written twice, docs/heads.md); a generated task:
    builtin:copy | reverse | addition | flipflop | counting | selective_copy | mqar | indexing |
    parity | passkey (lm/data/tasks.py, docs/tasks.md)."""
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
    task_lengths: int | str = "1-20"
    """builtin tasks: lengths of the training examples, LOW-HIGH, each drawn uniformly (symbols
    of the input, or digits of each operand); builtin:repeats: letters of each sequence, 1-52;
    builtin:passkey: characters of each example, up to the context (unset: the context)."""
    task_eval_lengths: int | str = "1-40"
    """builtin tasks: the lengths exact-match accuracy is measured at (lm eval, lm compare)."""
    task_examples: int = 20000
    """builtin tasks and builtin:repeats: training examples (documents) generated (val_fraction
    of them held out)."""
    task_eval_examples: int = 100
    """builtin tasks: examples per evaluation length (per length and split for a split task)."""
    flipflop_ignore: float = 0.8
    """builtin:flipflop: the probability that an instruction between the first write and the
    last read is ignore (the paper's FFL(p)); evaluated also at 0.98 (sparse) and 0.1 (dense)."""
    counting_variables: int = 3
    """builtin:counting: variables a program may use, 1 to 3 (x, y, z)."""
    selective_copy_density: float = 0.25
    """builtin:selective_copy: the share of positions holding a symbol to copy, in (0, 1];
    evaluated also at twice it (dense, at most 1) and half (sparse)."""
    addition_hints: bool = False
    """builtin:addition: each digit preceded by a letter naming its place (index hints, Zhou et
    al. 2023/2024); a number then has at most 26 digits."""
    addition_reversed: bool = False
    """builtin:addition: numbers and sums written least significant digit first (Zhou et al.)."""
    passkey_lengths: str = "1x,1.5x,2x,3x,4x,6x,8x"
    """builtin:passkey: the total lengths its accuracy is measured at, multiples of the trained
    context (2x) or characters (512); it trains up to the context (data.task_lengths)."""
    repeats_distinct: bool = True
    """builtin:repeats: a sequence's letters all different (as in lm heads's probe); false:
    drawn with replacement, as Olsson et al.'s random tokens are, so a letter may recur in it."""
    passkey_depths: int = 5
    """builtin:passkey: depths of the key measured at, evenly spaced from the filler's start (0%)
    to its end (100%); 5: 0, 25, 50, 75 and 100%."""
    num_proc: int | None = None
    """Processes for tokenizing; default: one below 2 MB of text, else the CPU count (at most 8)."""
    cache_dir: str | None = None
    """Where tokenized data is cached; default $LM_CACHE, $XDG_CACHE_HOME/lm or ~/.cache/lm."""

    def __post_init__(self) -> None:
        s = "data"
        choice(s, "mode", self.mode, DATA_MODES)
        choice(s, "split_by", self.split_by, SPLIT_BY)
        choice(s, "val_split", self.val_split, VAL_SPLITS)
        positive(s, self, "max_documents", "num_proc", "vocab_size")
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
        """A builtin: that exists; a task's own keys set only for a task, each within range
        (:mod:`lm.config.tasks`)."""
        source = self.source.strip()
        if source.startswith("builtin:") and source.removeprefix("builtin:") not in BUILTINS:
            known = ", ".join(f"builtin:{b}" for b in BUILTINS)
            raise ConfigError(f"data.source: unknown builtin {source!r} (builtins: {known})")
        check_task(self, DataConfig.__dataclass_fields__)

    def task_ranges(self) -> tuple[range, range]:
        """A task's training and evaluation lengths; the passkey task's are both its trained
        length (its accuracy is measured at ``passkey_lengths``, ``lm.config.tasks``)."""
        trained = parse_task_lengths(self.task_lengths, "data.task_lengths")
        if task_of(self.source) == "passkey":
            return trained, trained
        return trained, parse_task_lengths(self.task_eval_lengths, "data.task_eval_lengths")


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
    """AdamW's first-moment decay (and Muon's momentum)."""
    beta2: float = 0.95
    """AdamW's second-moment decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    eval_every: int = 250
    """Evaluate every N steps (and at the end); 0 disables periodic evaluation."""
    eval_steps: int | None = None
    """Batches per evaluation; default: the whole validation split."""
    eval_batch_size: int | None = None
    """Sequences per evaluation batch; default: the training micro-batch (of one process)."""
    head_scores: bool = True
    """At each evaluation, score every attention head (previous-token, induction, duplicate,
    first-token) and the in-context learning score into metrics.jsonl (docs/heads.md)."""
    checkpoint_every: int = 500
    """Save a checkpoint every N steps (and at the end); 0: only at the end."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep."""
    log_every: int = 10
    """Write a training line to metrics.jsonl every N steps."""
    seed: int = 1337
    """Seed of the initial weights, the batches' order and dropout; lm compare --seeds varies it."""
    device: str = "auto"
    """auto (cuda, then mps, then cpu) | cpu | cuda | mps."""
    dtype: str = "auto"
    """auto | fp32 | bf16 | fp16 (autocast; fp16 adds a gradient scaler). auto: on a CPU with
    bf16 instructions, bf16 from model.d_model 128 where model.kernel is math or auto (which then
    takes math), else fp32 (lm.runtime.device.auto_rule); on a GPU bf16 where supported, else
    fp16."""
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
        choice(s, "schedule", self.schedule, SCHEDULES)
        choice(s, "optimizer", self.optimizer, OPTIMIZERS)
        choice(s, "device", self.device, DEVICES)
        choice(s, "dtype", self.dtype, DTYPES)
        choice(s, "parallel", self.parallel, ("ddp", "fsdp"))
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
            raise ConfigError(
                f"train.compile: expected true, false or null, got {shown(self.compile)}"
            )
        choice(s, "on_nonfinite", self.on_nonfinite, ON_NONFINITE)
        choice(s, "on_checkpoint_error", self.on_checkpoint_error, ("stop", "continue"))
        positive(s, self, "max_steps", "batch_size", "grad_accum", "lr", "keep_checkpoints")
        positive(s, self, "micro_batch_size", "dist_timeout_s", "threads")
        positive(s, self, "muon_lr")
        positive(s, self, "eval_steps", "eval_batch_size", "log_every")
        positive(s, self, "warmup_steps", "min_lr", "weight_decay", "grad_clip", allow_zero=True)
        positive(s, self, "eval_every", "checkpoint_every", allow_zero=True)
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
        # The passkey task trains up to the context: its data section learns it here.
        object.__setattr__(self, "data", at_context(self.data, self.model.context_length))
        check_task_fits(self.data, self.model.context_length)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def replace(self, **sections: Any) -> Config:
        return dataclasses.replace(self, **sections)
