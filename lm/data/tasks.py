"""Generated tasks where position schemes separate: ``builtin:copy``, ``builtin:reverse``,
``builtin:addition`` (the length-generalization tasks of Kazemnejad et al. 2023, "The Impact of
Positional Encoding on Length Generalization in Transformers", and Ruoss et al. 2023).

An example is a prompt ending in ``=`` and its answer, one document: ``cabd=cabd`` (copy),
``cabd=dbac`` (reverse), ``384+529=913`` (addition). Its length is the number of symbols of
the input: letters ``a``-``j`` for copy and reverse, digits of each operand for addition (the
answer written most significant digit first, without leading zeros). A model is trained on one
range of lengths (``data.task_lengths``) with the loss on the answer only, and asked for exact
answers at every length of another (``data.task_eval_lengths``), usually longer.

Examples are drawn from numpy generators seeded by ``data.seed`` (and, for evaluation, the
length), never by ``train.seed``: every run of a sweep trains and is tested on the same ones.
"""

from __future__ import annotations

import numpy as np

from lm.config.names import TASKS

SYMBOLS = "abcdefghij"
DIGITS = "0123456789"
SEPARATOR = "="


def example(task: str, length: int, rng: np.random.Generator) -> tuple[str, str]:
    """One ``(prompt, answer)`` of ``task`` at ``length``."""
    if task == "addition":
        a, b = (_number(length, rng) for _ in range(2))
        return f"{a}+{b}{SEPARATOR}", str(a + b)
    symbols = "".join(SYMBOLS[i] for i in rng.integers(0, len(SYMBOLS), size=length))
    answer = symbols if task == "copy" else symbols[::-1]
    return symbols + SEPARATOR, answer


def _number(digits: int, rng: np.random.Generator) -> int:
    """A number of exactly ``digits`` digits (0-9 for one digit)."""
    first = rng.integers(0 if digits == 1 else 1, 10)
    rest = rng.integers(0, 10, size=digits - 1)
    return int("".join(DIGITS[d] for d in (first, *rest)))


def training_examples(task: str, lengths: range, count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` examples, each of a length drawn uniformly from ``lengths``."""
    rng = np.random.default_rng([seed, TASKS.index(task)])
    return [example(task, int(rng.choice(lengths)), rng) for _ in range(count)]


def evaluation_examples(task: str, length: int, count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` examples at ``length``, the same for every run with this ``seed``."""
    rng = np.random.default_rng([seed, TASKS.index(task), length, 1])
    return [example(task, length, rng) for _ in range(count)]
