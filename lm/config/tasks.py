"""A generated task's settings checked at load (``DataConfig`` and ``Config`` call these): its
own keys set for it only, each within range, lengths it can be written at, and examples that
fit the context. ``data`` is a ``DataConfig`` (not imported: sections.py imports this).

The passkey task trains up to the context (:func:`at_context`) and is measured at lengths past
it (:func:`passkey_lengths`), as Position Interpolation (Chen et al. 2023, arXiv 2306.15595,
section 3.2) measures its models."""

from __future__ import annotations

import dataclasses
from typing import Any

from lm.config.errors import ConfigError
from lm.config.names import HINTS, LETTER_TASKS, REPEATS, TASKS, task_of, task_tokens
from lm.config.values import parse_context_lengths, parse_task_lengths, shown

TASK_OWN_KEYS = {
    "flipflop_ignore": "flipflop",
    "counting_variables": "counting",
    "selective_copy_density": "selective_copy",
    "addition_hints": "addition",
    "addition_reversed": "addition",
    "passkey_lengths": "passkey",
    "passkey_depths": "passkey",
    "repeats_distinct": REPEATS,
}
"""Settings of one generated source each: set for another source, they are an error."""

TASK_KEYS = ("task_lengths", "task_eval_lengths", "task_examples", "task_eval_examples")
REPEATS_KEYS = ("task_lengths", "task_examples")
"""The task keys ``builtin:repeats`` reads: its sequences' lengths and how many it writes."""
REPEAT_SYMBOLS = 52
"""Letters ``builtin:repeats`` draws a sequence's distinct symbols from (a-z, A-Z)."""

PASSKEY_SHORTEST = len("The pass key is 12345. ") + len("What is the pass key? ") + 5
"""Characters of a passkey example with no filler: the key sentence, the question and the
answer (``lm.data.tasks.passkey``; tests/test_passkey.py holds the two to each other)."""


def check_task(data: Any, fields: dict[str, Any]) -> None:
    """``data``'s task keys: set only for a task (``fields``: DataConfig's, with defaults), a
    task's own keys only for it, each within range."""
    task = task_of(data.source)
    repeats = data.source.strip() == f"builtin:{REPEATS}"
    for key, owner in TASK_OWN_KEYS.items():
        if (REPEATS if repeats else task) != owner and getattr(data, key) != fields[key].default:
            raise ConfigError(f"data.{key}: applies to data.source: builtin:{owner} only")
    if task is None:
        for key in TASK_KEYS:
            if getattr(data, key) != fields[key].default and not (repeats and key in REPEATS_KEYS):
                tasks = ", ".join(f"builtin:{t}" for t in TASKS)
                also = f"; builtin:{REPEATS} reads task_lengths and task_examples" * repeats
                raise ConfigError(f"data.{key}: applies to the builtin tasks ({tasks}) only{also}")
        if repeats:
            _check_repeats(data)
        return
    _check_settings(data)
    if task == "passkey":
        _check_passkey(data, fields)
    if data.task_eval_examples <= 0:
        raise ConfigError(
            f"data.task_eval_examples: must be > 0, got {shown(data.task_eval_examples)}"
        )
    if data.task_examples < 2:
        raise ConfigError(
            f"data.task_examples: {data.task_examples}; at least 2 (one to train on, one to "
            "validate on)"
        )
    for key, lengths in zip(TASK_KEYS[:2], data.task_ranges(), strict=True):
        _check_lengths(data, task, key, lengths)


def _check_repeats(data: Any) -> None:
    """``builtin:repeats``: sequences of distinct letters at most :data:`REPEAT_SYMBOLS` long,
    and enough of them to hold some out."""
    lengths = parse_task_lengths(data.task_lengths, "data.task_lengths")
    if data.repeats_distinct and lengths[-1] > REPEAT_SYMBOLS:
        raise ConfigError(
            f"data.task_lengths: builtin:{REPEATS} writes sequences of distinct letters and "
            f"there are {REPEAT_SYMBOLS} (a-z, A-Z); at most {REPEAT_SYMBOLS}, got "
            f"{data.task_lengths!r}"
        )
    if data.task_examples < 2:
        raise ConfigError(
            f"data.task_examples: {data.task_examples}; at least 2 (one to train on, one to "
            "validate on)"
        )


def _check_settings(data: Any) -> None:
    if not 0.0 <= data.flipflop_ignore < 1.0:
        raise ConfigError(
            f"data.flipflop_ignore: must be in [0, 1) (a program needs writes and reads), "
            f"got {data.flipflop_ignore!r}"
        )
    if data.counting_variables not in (1, 2, 3):
        raise ConfigError(
            f"data.counting_variables: {shown(data.counting_variables)} is not 1, 2 or 3 "
            "(the variables x, y, z)"
        )
    if not 0.0 < data.selective_copy_density <= 1.0:
        raise ConfigError(
            "data.selective_copy_density: must be in (0, 1] (the share of positions to "
            f"copy), got {data.selective_copy_density!r}"
        )


def _check_passkey(data: Any, fields: dict[str, Any]) -> None:
    """The passkey task's own keys; its lengths are characters, so one character a token."""
    if data.tokenizer not in ("char", "byte"):
        raise ConfigError(
            f"data.tokenizer: {data.tokenizer} with builtin:passkey, whose lengths are "
            "characters; use char or byte"
        )
    if data.task_eval_lengths != fields["task_eval_lengths"].default:
        raise ConfigError(
            "data.task_eval_lengths: builtin:passkey is measured at data.passkey_lengths "
            "(multiples of the context such as 2x, or characters)"
        )
    trained = parse_task_lengths(data.task_lengths, "data.task_lengths")
    if data.task_lengths != fields["task_lengths"].default and trained[0] < PASSKEY_SHORTEST:
        raise ConfigError(
            f"data.task_lengths: {data.task_lengths!r} trains builtin:passkey at {trained[0]} "
            f"characters, and the key sentence, the question and the answer take "
            f"{PASSKEY_SHORTEST}: at least {PASSKEY_SHORTEST}"
        )
    if isinstance(data.passkey_depths, bool) or not isinstance(data.passkey_depths, int):
        raise ConfigError(f"data.passkey_depths: {shown(data.passkey_depths)} is not an integer")
    if data.passkey_depths < 2:
        raise ConfigError(
            f"data.passkey_depths: {data.passkey_depths}; at least 2 (the filler's start and end)"
        )
    try:
        parse_context_lengths(str(data.passkey_lengths))
    except ValueError as e:
        raise ConfigError(f"data.passkey_lengths: {e}") from None


def at_context(data: Any, context_length: int) -> Any:
    """``data`` with the passkey task's training length, left unset, made the context: its
    examples fill the context. Other data as it is."""
    if task_of(data.source) != "passkey":
        return data
    if context_length < PASSKEY_SHORTEST:
        raise ConfigError(
            f"model.context_length: {context_length} with builtin:passkey, which trains at the "
            f"context; the key sentence, the question and the answer take {PASSKEY_SHORTEST} "
            f"characters: at least {PASSKEY_SHORTEST}"
        )
    default = type(data).__dataclass_fields__["task_lengths"].default
    if data.task_lengths != default:
        return data
    return dataclasses.replace(data, task_lengths=context_length)


def passkey_lengths(data: Any, context_length: int) -> list[int]:
    """The passkey task's evaluation lengths in characters, ``data.passkey_lengths`` resolved
    against the trained context (``2x`` -> twice it), shortest first, each once."""
    lengths = set()
    for spec in parse_context_lengths(str(data.passkey_lengths)):
        multiple = spec.endswith("x")
        lengths.add(round(float(spec[:-1]) * context_length) if multiple else int(spec))
    return sorted(lengths)


def _check_lengths(data: Any, task: str, key: str, lengths: range) -> None:
    """Lengths a task can be written at: flip-flop's two instructions, indexing's two letters,
    26 letters of distinct keys or indexed letters, 26 index hints."""
    text = getattr(data, key)
    if task == "flipflop" and lengths[0] < 2:
        raise ConfigError(
            f"data.{key}: flip-flop programs have at least 2 instructions (a write, "
            f"then a read), got {text!r}"
        )
    if task == "indexing" and lengths[0] < 2:
        raise ConfigError(
            f"data.{key}: indexing needs at least 2 letters (one to find, one to answer), "
            f"got {text!r}"
        )
    if task in LETTER_TASKS and lengths[-1] > 26:
        raise ConfigError(
            f"data.{key}: {task} at length {lengths[-1]} needs that many distinct "
            f"{LETTER_TASKS[task]} and there are 26 letters; at most 26"
        )
    if task == "addition" and data.addition_hints and lengths[-1] + 1 > HINTS:
        raise ConfigError(
            f"data.{key}: addition at length {lengths[-1]} writes sums of {lengths[-1] + 1} "
            f"digits and data.addition_hints has {HINTS} hints (a-z); at most {HINTS - 1}"
        )


def check_task_fits(data: Any, context_length: int) -> None:
    """A task's longest training and evaluation examples fit the context (its inputs: every
    token but the last target), whatever the scheme: decoding past the context would cut the
    prompt, and a learned table has no row there."""
    task = task_of(data.source)
    if task is None:
        return
    if task == "passkey":
        _passkey_fits(data, context_length)
        return
    for key, lengths in zip(TASK_KEYS[:2], data.task_ranges(), strict=True):
        longest = task_tokens(task, lengths[-1], data.addition_hints)
        if longest - 1 > context_length:
            raise ConfigError(
                f"data.{key}: {task} at length {lengths[-1]} makes examples of {longest} "
                f"tokens with <eod>, more than model.context_length={context_length} + 1; "
                "raise the context or shorten the lengths"
            )


def _passkey_fits(data: Any, context_length: int) -> None:
    """The passkey task trains up to the context: its longest training length is the context
    (a run's config.yaml keeps the lengths, so a context changed later is not trained short),
    its shortest may be less (``64-128``: every distance up to the context, as the documents
    PI fine-tunes on hold). Every evaluation length holds the key sentence and the question (a
    longer one than the context is the point: no fit asked)."""
    trained = parse_task_lengths(data.task_lengths, "data.task_lengths")
    if trained[-1] != context_length:
        raise ConfigError(
            f"data.task_lengths: {data.task_lengths!r}; builtin:passkey trains up to the "
            f"context, model.context_length={context_length}: {context_length} or "
            f"LOW-{context_length} (or leave it unset)"
        )
    shortest = passkey_lengths(data, context_length)[0]
    if shortest < PASSKEY_SHORTEST:
        raise ConfigError(
            f"data.passkey_lengths: {data.passkey_lengths!r} asks at {shortest} characters, "
            f"and the key sentence, the question and the answer take {PASSKEY_SHORTEST}: "
            f"at least {PASSKEY_SHORTEST}"
        )
