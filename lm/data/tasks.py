"""Generated tasks where position schemes separate: ``builtin:copy``, ``builtin:reverse``,
``builtin:addition`` (the length-generalization tasks of Kazemnejad et al. 2023, "The Impact of
Positional Encoding on Length Generalization in Transformers", and Ruoss et al. 2023), and
``builtin:flipflop`` (Liu et al. 2023, "Exposing Attention Glitches with Flip-Flop Language
Modeling", NeurIPS 2023, arXiv 2306.00946, section 3).

An example is a prompt ending in ``=`` and its answer, one document: ``cabd=cabd`` (copy),
``cabd=dbac`` (reverse), ``384+529=913`` (addition). Its length is the number of symbols of
the input: letters ``a``-``j`` for copy and reverse, digits of each operand for addition (the
answer written most significant digit first, without leading zeros). A model is trained on one
range of lengths (``data.task_lengths``) with the loss on the answer only, and asked for exact
answers at every length of another (``data.task_eval_lengths``), usually longer.

A flip-flop example is a program of ``length`` instructions, each a letter and a bit: ``w`` writes
its bit to a one-bit memory, ``i`` is ignored, ``r`` reads the memory (its bit is the last one
written). The first instruction writes, the last reads, and its bit is the answer:
``w1i0r1i1w0i1r`` -> ``0``. In between, each instruction is ``i`` with probability p (the
ignore rate) and ``w`` or ``r`` with (1 - p)/2 each: the paper's FFL(p). A model trained at one
rate (``data.flipflop_ignore``, the paper's 0.8) is asked at three (:data:`FLIPFLOP_SPLITS`):
the training rate, sparse programs (0.98: the last write is far back, across distances training
rarely showed) and dense ones (0.1: many writes, the latest one near).

Examples are drawn from numpy generators seeded by ``data.seed`` (and, for evaluation, the
length), never by ``train.seed``: every run of a sweep trains and is tested on the same ones.
"""

from __future__ import annotations

import numpy as np

from lm.config.names import TASKS

SYMBOLS = "abcdefghij"
DIGITS = "0123456789"
SEPARATOR = "="
FLIPFLOP_SPLITS = (("in-distribution", None), ("sparse", 0.98), ("dense", 0.1))
"""Flip-flop's evaluation splits and their ignore rates (the paper's FFL(0.98) and FFL(0.1));
None: the rate the run trained at."""


def splits(task: str, ignore: float) -> tuple[tuple[str | None, float], ...]:
    """The splits a task is asked in, each with its flip-flop ignore rate: flip-flop's three,
    or one unnamed split for the other tasks."""
    if task != "flipflop":
        return ((None, ignore),)
    return tuple((name, ignore if rate is None else rate) for name, rate in FLIPFLOP_SPLITS)


def example(
    task: str, length: int, rng: np.random.Generator, ignore: float = 0.8
) -> tuple[str, str]:
    """One ``(prompt, answer)`` of ``task`` at ``length`` (``ignore``: flip-flop's rate)."""
    if task == "flipflop":
        return _flipflop(length, rng, ignore)
    if task == "addition":
        a, b = (_number(length, rng) for _ in range(2))
        return f"{a}+{b}{SEPARATOR}", str(a + b)
    symbols = "".join(SYMBOLS[i] for i in rng.integers(0, len(SYMBOLS), size=length))
    answer = symbols if task == "copy" else symbols[::-1]
    return symbols + SEPARATOR, answer


def _flipflop(length: int, rng: np.random.Generator, ignore: float) -> tuple[str, str]:
    """A program of ``length`` >= 2 instructions: write, ``length - 2`` drawn from FFL(ignore),
    read; its prompt ends with the last ``r``, its answer is that read's bit."""
    kinds = rng.choice(3, size=length - 2, p=[(1 - ignore) / 2, (1 - ignore) / 2, ignore])
    bits = rng.integers(0, 2, size=length - 1)
    memory = int(bits[0])
    program = [f"w{memory}"]
    for kind, bit in zip(kinds, bits[1:], strict=True):
        if kind == 0:
            memory = int(bit)
            program.append(f"w{memory}")
        elif kind == 1:
            program.append(f"r{memory}")
        else:
            program.append(f"i{bit}")
    return "".join(program) + "r", str(memory)


def _number(digits: int, rng: np.random.Generator) -> int:
    """A number of exactly ``digits`` digits (0-9 for one digit)."""
    first = rng.integers(0 if digits == 1 else 1, 10)
    rest = rng.integers(0, 10, size=digits - 1)
    return int("".join(DIGITS[d] for d in (first, *rest)))


def training_examples(
    task: str, lengths: range, count: int, seed: int, ignore: float = 0.8
) -> list[tuple[str, str]]:
    """``count`` examples, each of a length drawn uniformly from ``lengths``."""
    rng = np.random.default_rng([seed, TASKS.index(task)])
    return [example(task, int(rng.choice(lengths)), rng, ignore) for _ in range(count)]


def evaluation_examples(
    task: str, length: int, count: int, seed: int, ignore: float = 0.8, split: int = 0
) -> list[tuple[str, str]]:
    """``count`` examples at ``length`` (in flip-flop's ``split``-th split, at rate ``ignore``),
    the same for every run with this ``seed``."""
    key = [seed, TASKS.index(task), length, 1] + ([split] if split else [])
    rng = np.random.default_rng(key)
    return [example(task, length, rng, ignore) for _ in range(count)]
