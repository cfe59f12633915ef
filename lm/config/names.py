"""The words a config may use, in one place: every choice of every section, the position schemes
with where each acts, and the builtin sources with the tasks among them.

The model's parts (``lm.model.position``) and the data's generators (``lm.data.tasks``) read
these names; the config never reads them back, so it loads without importing the model or the
data (a test holds the model's registry to this table).
"""

from __future__ import annotations

SCHEME_PLACES = {
    "rope": "queries and keys",
    "sinusoidal": "embeddings",
    "learned": "embeddings",
    "alibi": "scores",
    "t5": "scores",
    "kerple": "scores",
    "fire": "scores",
    "sandwich": "scores",
    "xpos": "queries and keys",
    "fox": "scores",
    "cope": "scores",
    "none": "nothing",
}
"""Every ``model.position`` and where it acts (notes, "Causal masks restrict access; position
signals describe location"): on the embeddings (added to ``E[w]``, below every layer at once),
on the queries and keys (rotated), on the scores (a bias added to ``S``), or nowhere."""

POSITIONS = tuple(SCHEME_PLACES)

LEARNED_BIASES = ("t5", "kerple", "fire", "fox", "cope")
"""The schemes whose score bias has learned parameters, so that training takes its gradient
through the attention kernel (``lm.model.plan`` picks the kernel for it)."""

ROTARY = ("rope", "xpos")
"""The schemes that rotate queries and keys by RoPE's angles, and read RoPE's keys."""

NO_FLEX = ("cope",)
"""The schemes whose bias FlexAttention's score function cannot compute: CoPE's positions sum
gates over keys, where a score function sees one query-key pair at a time."""

NORMALIZATIONS = ("softmax", "ssmax", "stick_breaking")
"""``model.normalize``: how scores become attention weights (``lm.model.normalize``)."""

KERNELS = ("sdpa", "flex", "math", "auto")
"""``model.kernel``: how ``softmax(S + M) V`` is computed (``lm.model.kernels``); ``auto``: the
faster of sdpa and math, measured by ``lm train`` on this machine (``lm.training.tune``)."""

ROPE_SCALINGS = ("none", "pi", "ntk", "yarn")
"""RoPE context extensions (``lm.model.position.rope``): none, Position Interpolation,
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
)
"""The generated tasks (``lm.data.tasks``); new ones go last (an index seeds a task's draws)."""

HINTS = 26
"""Index hints of ``builtin:addition`` (the letters a-z): a number has at most this many digits."""

LETTER_TASKS = {"mqar": "key-value pairs (one distinct letter a key)", "indexing": "letters"}
"""Tasks whose length counts distinct letters, so at most 26 of them."""

BUILTINS = ("python-docs", *TASKS)
"""``data.source: builtin:NAME``: CPython's help topics, or a generated task."""

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
    return (length + 1) + length + 1  # copy, reverse, selective copy


SPLITS = ("val", "train")
"""The splits ``lm eval --split`` and ``lm.loss_at(split=...)`` read."""
