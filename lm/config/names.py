"""The words a config may use, in one place: every choice of every section, the table of
position schemes (:data:`SCHEMES`, a row each), and the builtin sources with the tasks among them.

The model's schemes (``lm.model.schemes``) and the data's generators (``lm.data.tasks``) read
these names; the config never reads them back, so it loads without importing the model or the
data.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class Place(enum.Enum):
    """Where a position scheme acts (notes, "Causal masks restrict access; position signals
    describe location"): on the embeddings (added to ``E[w]``, below every layer at once), on
    the queries and keys (rotated), on the scores (a bias added to ``S``), or nowhere."""

    EMBEDDINGS = "embeddings"
    QUERIES_AND_KEYS = "queries and keys"
    SCORES = "scores"
    NOTHING = "nothing"


ROTARY_KEYS = ("rope_base", "rope_scaling", "rope_fraction", "rope_original_context", "rope_p")
"""The keys of RoPE's angles, read by every scheme that rotates by them (RoPE, xPos)."""


@dataclass(frozen=True)
class SchemeRow:
    """One position scheme, everything the config, the model and the docs ask of it. A builtin's
    is its line of :data:`SCHEMES`; a scheme written outside lm declares its own on its class
    (``row = lm.SchemeRow(place=lm.Place.SCORES, ...)``), and ``name`` and ``code`` are then
    filled in with its spec (``lm.config.outside``)."""

    name: str = ""
    """Its ``model.position``: a builtin's name, or an outside scheme's spec."""
    place: Place = Place.NOTHING
    code: str = ""
    """Its class, ``module:Class`` under ``lm.model.schemes`` (imported by the model, never
    here), or an outside scheme's spec."""
    learned_bias: bool = False
    """Its score bias has learned parameters, so training takes their gradient through the
    attention kernel (``lm.model.kernels.choose_kernel`` picks the kernel for it)."""
    wide_keys: bool = False
    """Its queries and keys leave wider than the values (PoPE's ``2 d_k``), where PyTorch's fused
    CPU attention needs one width: SDPA then runs its math path, so training on CPU takes the
    notes' formula as for a learned bias (``lm.model.kernels.choose_kernel``)."""
    flex: bool = True
    """FlexAttention's score function, which sees one query-key pair at a time, can compute it."""
    keys: tuple[str, ...] = ()
    """The ``ModelConfig`` keys it reads beyond the shape every scheme reads (RoPE's
    ``rope_base``, T5's ``t5_buckets`` ...): a model no layer of which reads a key ignores it
    (``--init-from`` compares it only where read; the config refuses some set where unread); the
    docs' table of keys says which schemes read each. A scheme that reads ``rope_scaling``
    rotates by RoPE's angles and takes its context extensions (:func:`extends`)."""
    table: bool = False
    """It adds a learned table, one vector per trained position (``model.position_range``), so
    it has nothing past the last: ``lm eval`` gives no loss there, the export's rows are the
    table's, and ``lm view`` refuses a longer text."""
    even: tuple[str, ...] = ()
    """The widths it splits into pairs, each a ``ModelConfig`` attribute that must be even."""
    reads_positions: bool = True
    """It reads token positions; FoX's forgetting and CoPE's counting are gates over the
    sequence's order instead, and ``none`` reads nothing."""


SCHEMES = {
    row.name: row
    for row in (
        SchemeRow(
            "rope", Place.QUERIES_AND_KEYS, "rope:RoPE", keys=ROTARY_KEYS, even=("head_dim",)
        ),
        SchemeRow(
            "sinusoidal",
            Place.EMBEDDINGS,
            "embeddings:Sinusoidal",
            keys=("scale_embeddings",),
            even=("d_model",),
        ),
        SchemeRow("learned", Place.EMBEDDINGS, "embeddings:Learned", table=True),
        SchemeRow("alibi", Place.SCORES, "biases:ALiBi"),
        SchemeRow(
            "t5",
            Place.SCORES,
            "biases:T5",
            keys=("t5_buckets", "t5_max_distance"),
            learned_bias=True,
        ),
        SchemeRow("kerple", Place.SCORES, "biases:KERPLE", learned_bias=True),
        SchemeRow(
            "fire",
            Place.SCORES,
            "biases:FIRE",
            keys=("fire_width", "fire_threshold"),
            learned_bias=True,
        ),
        SchemeRow("sandwich", Place.SCORES, "biases:Sandwich", even=("d_model",)),
        SchemeRow(
            "xpos",
            Place.QUERIES_AND_KEYS,
            "rope:XPos",
            keys=(*ROTARY_KEYS, "xpos_scale_base"),
            even=("head_dim",),
        ),
        SchemeRow("fox", Place.SCORES, "content:FoX", learned_bias=True, reads_positions=False),
        SchemeRow(
            "cope",
            Place.SCORES,
            "content:CoPE",
            keys=("cope_max",),
            learned_bias=True,
            flex=False,
            reads_positions=False,
        ),
        SchemeRow("pope", Place.QUERIES_AND_KEYS, "pope:PoPE", keys=("rope_base",), wide_keys=True),
        SchemeRow(
            "fope", Place.QUERIES_AND_KEYS, "fope:FoPE", keys=("rope_base",), even=("head_dim",)
        ),
        SchemeRow(
            "hope", Place.QUERIES_AND_KEYS, "hope:HoPE", keys=("rope_base",), even=("head_dim",)
        ),
        SchemeRow(
            "dape", Place.SCORES, "dape:DAPE", keys=("dape_bias",), learned_bias=True, flex=False
        ),
        SchemeRow(
            "path", Place.SCORES, "path:PaTH", learned_bias=True, flex=False, reads_positions=False
        ),
        SchemeRow("none", Place.NOTHING, "base:NoPosition", reads_positions=False),
    )
}
"""Every ``model.position``, one row each: the one table of position schemes. A new scheme is
its class and its row here; every list below, the config's checks, the model's registry
(``lm.model.schemes.SCHEME_CLASSES``) and the docs' tables are read from it (tests hold
``configs/default.yaml``'s comment, ``docs/positions.md`` and ``ModelConfig.position``'s
docstring to it)."""

POSITIONS = tuple(SCHEMES)
SCORE_BIASES = tuple(n for n, row in SCHEMES.items() if row.place is Place.SCORES)
FORMULA_ON_CPU = tuple(n for n, row in SCHEMES.items() if row.learned_bias or row.wide_keys)
"""The schemes that train through the notes' formula on CPU (``lm.model.kernels``)."""
NO_FLEX = tuple(n for n, row in SCHEMES.items() if not row.flex)
NO_POSITIONS = tuple(n for n, row in SCHEMES.items() if not row.reads_positions)
"""The schemes that read no token positions, so that ``model.random_positions`` has nothing to
change."""


OUTSIDE: dict[str, SchemeRow] = {}
"""The rows of the schemes written outside lm that this process has loaded, by spec
(``path/to/file.py:Class`` resolved, or ``module:Class``): ``lm.config.outside`` fills it in
when a config names one, after importing its class."""


def row(name: str) -> SchemeRow:
    """The row of ``model.position`` ``name``: a builtin's, or a loaded outside scheme's."""
    return SCHEMES[name] if name in SCHEMES else OUTSIDE[name]


def readers(key: str, positions: Iterable[str] = POSITIONS) -> tuple[str, ...]:
    """The schemes among ``positions`` (a model's ``layer_positions``; default every builtin)
    whose row reads ``model.KEY``, each once, in order."""
    return tuple(n for n in dict.fromkeys(positions) if key in row(n).keys)


def extends(positions: Iterable[str]) -> bool:
    """Whether a model whose layers use ``positions`` takes a RoPE context extension: one of them
    reads ``model.rope_scaling`` (rotates by RoPE's angles). The one rule of ``model.rope_scaling``
    in a config, ``lm eval --rope-scaling`` and ``lm compare``'s ``eval.rope_scaling``."""
    return bool(readers("rope_scaling", positions))


XPOS_REACH = 64
"""xPos's positions stay below ``XPOS_REACH * model.xpos_scale_base``: there its largest key
scale is ``3.5^64``, about 7e34, a margin under fp32's 3.4e38 for the keys it multiplies."""

NORMALIZATIONS = ("softmax", "ssmax", "stick_breaking")
"""``model.normalize``: how scores become attention weights (``lm.model.normalize``)."""

NORMS = ("layernorm", "rmsnorm")
"""``model.norm``: the block's norm layers (``lm.model.transformer``; RMSNorm in
``lm.model.rmsnorm``): LayerNorm (GPT-2) or RMSNorm (Llama)."""

MLPS = ("gelu", "swiglu", "relu2", "none")
"""``model.mlp``: the block's token-wise network (``lm.model.transformer``): GELU (GPT-2), SwiGLU
(Llama), squared ReLU (Primer, nanochat), or none: an attention-only block (Elhage et al. 2021)."""

KERNELS = ("sdpa", "flex", "math", "auto")
"""``model.kernel``: how ``softmax(S + M) V`` is computed (``lm.model.kernels``); ``auto``: sdpa
or math by the CPU's bf16 instructions and the width (``lm.runtime.device.auto_rule``)."""

ROPE_SCALINGS = ("none", "pi", "ntk", "yarn")
"""RoPE context extensions (``lm.model.schemes.rope``): none, Position Interpolation,
NTK-aware, YaRN."""

DATA_MODES = ("packed", "padded")
SPLIT_BY = ("file", "line", "paragraph")
VAL_SPLITS = ("tail", "random")
BUILTIN_TOKENIZERS = ("char", "byte", "bpe")

TASKS = (
    "copy",
    "reverse",
    "addition",
    "flipflop",
    "counting",
    "selective_copy",
    "mqar",
    "indexing",
    "parity",
    "passkey",
)
"""The generated tasks (``lm.data.tasks``); new ones go last (an index seeds a task's draws)."""

HINTS = 26
"""Index hints of ``builtin:addition`` (the letters a-z): a number has at most this many digits."""

LETTER_TASKS = {"mqar": "key-value pairs (one distinct letter a key)", "indexing": "letters"}
"""Tasks whose length counts distinct letters, so at most 26 of them."""

REPEATS = "repeats"
"""``builtin:repeats``: generated text, random sequences each written twice
(``lm.data.tasks.repeats``), on which induction heads form within a small budget
(docs/heads.md). Not a task: the loss is on every token; it reads ``data.task_lengths`` and
``data.task_examples``."""

BUILTINS = ("python-docs", REPEATS, *TASKS)
"""``data.source: builtin:NAME``: CPython's help topics, generated repeats, or a generated
task."""

SCHEDULES = ("cosine", "linear", "constant", "wsd")
OPTIMIZERS = ("adamw", "muon")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "fp32", "bf16", "fp16")
ON_NONFINITE = ("stop", "skip")


def task_of(source: str) -> str | None:
    """The task a ``data.source`` names (``builtin:copy`` -> ``copy``), or None."""
    name = source.strip().removeprefix("builtin:")
    return name if source.strip().startswith("builtin:") and name in TASKS else None


def task_tokens(task: str, length: int, hints: bool = False) -> int:
    """Characters of the longest example of ``task`` at ``length`` with its end of document:
    prompt, answer and ``<eod>`` (``lm.data.tasks`` writes them; for addition the answer may
    carry one more digit, each digit after its index hint with ``hints``). The config checks
    with it that examples fit the context."""
    if task == "addition":
        width = 2 if hints else 1  # characters per digit
        return width * (2 * length) + 2 + width * (length + 1) + 1  # a+b= then the sum, <eod>
    if task == "flipflop":
        return 2 * length + 1  # length instructions of two characters, then <eod>
    if task == "counting":
        return 5 * length + len("print x=") + len("10") + 1  # statements of at most 5 characters
    if task == "mqar":
        # the pairs, then 3 slots a pair: length queries of 3 characters, the rest blank
        return 2 * length + 3 * length + 2 * length + 1
    if task == "indexing":
        return length + len("|a+25=") + 1 + 1  # letters, the query, the answer, <eod>
    if task == "parity":
        return length + 1 + 1 + 1
    if task == "passkey":
        return length + 1  # length counts the characters of the prompt and the answer
    return (length + 1) + length + 1  # copy, reverse, selective copy


SPLITS = ("val", "train")
"""The splits ``lm eval --split`` and ``lm.loss_at(split=...)`` read."""
