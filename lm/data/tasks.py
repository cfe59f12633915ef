"""Generated tasks where position schemes separate, each example a prompt and its answer.

- ``builtin:copy``, ``builtin:reverse``, ``builtin:addition``: the length-generalization tasks
  of Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in
  Transformers", and Ruoss et al. 2023. Addition may be written with index hints and reversed
  answers (Zhou et al. 2023, 2024: :func:`_addition`).
- ``builtin:flipflop``: Liu et al. 2023, "Exposing Attention Glitches with Flip-Flop Language
  Modeling", NeurIPS 2023, arXiv 2306.00946, section 3.
- ``builtin:counting`` and ``builtin:selective_copy``: Golovneva et al. 2024, "Contextual
  Position Encoding: Learning to Count What's Important", arXiv 2405.18719 (:func:`_counting`,
  :func:`_selective_copy`).
- ``builtin:mqar``: multi-query associative recall, Arora et al. 2023, "Zoology: Measuring and
  Improving Recall in Efficient Language Models", arXiv 2312.04927 (:func:`_mqar`).
- ``builtin:indexing``: indirect indexing, Gopalakrishnan et al. 2025, "Decoupling the 'What'
  and 'Where' With Polar Coordinate Positional Embeddings", arXiv 2509.10534 (:func:`_indexing`).
- ``builtin:parity``: parity check, Delétang et al. 2023, "Neural Networks and the Chomsky
  Hierarchy", and Ruoss et al. 2023 (:func:`_parity`).
- ``builtin:repeats`` is not a task but generated text (:func:`repeats`): random sequences each
  written twice, Olsson et al. 2022's "repeated random tokens" ("In-context Learning and
  Induction Heads", arXiv 2209.11895), on which induction heads form within a small budget.
- ``builtin:passkey``: passkey retrieval, Mohtashami & Jaggi 2023, "Landmark Attention:
  Random-Access Infinite Context Length for Transformers", arXiv 2305.16300, and Chen et al.
  2023, "Extending Context Window of Large Language Models via Positional Interpolation", arXiv
  2306.15595 (:func:`_passkey`). Its length is the whole example's, in characters.

An example is a prompt ending in ``=`` and its answer, one document: ``cabd=cabd`` (copy),
``cabd=dbac`` (reverse), ``384+529=913`` (addition). Its length is one number that grows with
the example (the symbols of the input, the digits of each operand, the instructions of a
program, the key-value pairs: each task's docstring says). A model is trained on one range of
lengths (``data.task_lengths``) with the loss on the answer only, and asked for exact answers
at every length of another (``data.task_eval_lengths``), usually longer.

Some tasks are also asked in *splits* (:func:`splits`) that change one setting away from the
trained one: flip-flop's ignore rate, counting's share of ``pass`` statements, selective copy's
density.

A flip-flop example is a program of ``length`` instructions, each a letter and a bit: ``w`` writes
its bit to a one-bit memory, ``i`` is ignored, ``r`` reads the memory (its bit is the last one
written). The first instruction writes, the last reads, and its bit is the answer:
``w1i0r1i1w0i1r`` -> ``0``. In between, each instruction is ``i`` with probability p (the
ignore rate) and ``w`` or ``r`` with (1 - p)/2 each: the paper's FFL(p). A model trained at one
rate (``data.flipflop_ignore``, the paper's 0.8) is asked at three (:data:`FLIPFLOP_SPLITS`):
the training rate, sparse programs (0.98: the last write is far back, across distances training
rarely showed) and dense ones (0.1: many writes, the latest one near).

Examples are drawn from numpy generators seeded by ``data.seed`` (and, for evaluation, the
length and split), never by ``train.seed``: every run of a sweep trains and is tested on the
same ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from lm.config.names import HINTS, TASKS
from lm.config.sections import DataConfig
from lm.config.tasks import PASSKEY_SHORTEST, REPEAT_SYMBOLS

SYMBOLS = "abcdefghij"
DIGITS = "0123456789"
LETTERS = "abcdefghijklmnopqrstuvwxyz"
SEPARATOR = "="
BLANK = "."
FLIPFLOP_SPLITS = (("in-distribution", None), ("sparse", 0.98), ("dense", 0.1))
"""Flip-flop's evaluation splits and their ignore rates (the paper's FFL(0.98) and FFL(0.1));
None: the rate the run trained at."""

COUNTING_VARIABLES = "xyz"
"""Counting's variable names: letters none of ``pass`` and ``print`` spells (with a character
tokenizer a name must not be read inside a keyword)."""
COUNTING_WEIGHTS = {"set": 1.0, "pass": 50.0, "increment": 7.0}
"""How often each statement is drawn, as the paper's generator (``count_data_gen.py``) weighs
them: 1 : 50 : 7."""
COUNTING_MORE_PASS = 200.0
"""The weight of ``pass`` in counting's "more pass" split: four times the trained 50, so the
increments to count lie farther apart (about 96% of statements are ``pass`` rather than 86%)."""
COUNTING_MAX = 10
"""The largest value a variable reaches; an increment past it is drawn again (the paper's)."""
SELECTIVE_COPY_SPLITS = (("in-distribution", 1.0), ("dense", 2.0), ("sparse", 0.5))
"""Selective copy's splits: the trained density times these (capped at every position)."""
MQAR_SLOTS = 3
"""Query slots per key-value pair: Zoology's 64-token sequences with 8 pairs leave (64 - 16) / 2
= 24 slots for the 8 queries."""
MQAR_POWER = 0.01
"""The power law of a query's slot, p(i) proportional to i^(a - 1) (Zoology's ``power_a``)."""
PASSKEY_FILLER = (
    "The grass is green. ",
    "The sky is blue. ",
    "The sun is yellow. ",
    "Here we go. ",
    "There and back again. ",
)
"""The filler sentences of Landmark attention's and Position Interpolation's passkey prompts,
repeated in this order."""
PASSKEY_KEY = "The pass key is {key}. "
PASSKEY_QUESTION = "What is the pass key? "


@dataclass(frozen=True)
class TaskSettings:
    """What, besides the length, shapes a task's examples; a split changes one of them."""

    ignore: float = 0.8
    """flipflop: the ignore rate p of FFL(p)."""
    variables: int = 3
    """counting: how many variables a program may use."""
    passes: float = COUNTING_WEIGHTS["pass"]
    """counting: the weight of ``pass`` against ``set`` 1 and ``increment`` 7."""
    density: float = 0.25
    """selective_copy: the share of positions holding a symbol to copy."""
    hints: bool = False
    """addition: each digit preceded by its index hint."""
    reversed: bool = False
    """addition: numbers written least significant digit first."""
    depth: float | None = None
    """passkey: where the key sentence stands in the filler, 0 (its start) to 1 (its end);
    None: drawn uniformly, as in training."""

    @classmethod
    def of(cls, data: DataConfig) -> TaskSettings:
        return cls(
            ignore=data.flipflop_ignore,
            variables=data.counting_variables,
            density=data.selective_copy_density,
            hints=data.addition_hints,
            reversed=data.addition_reversed,
        )


def splits(task: str, settings: TaskSettings) -> tuple[tuple[str | None, TaskSettings], ...]:
    """The splits a task is asked in, each with its settings: flip-flop's three rates,
    counting's trained programs and ones with more ``pass``, selective copy's trained, denser
    and sparser inputs; one unnamed split (the trained settings) for the other tasks."""
    change = dataclasses.replace
    if task == "flipflop":
        return tuple(
            (name, change(settings, ignore=settings.ignore if rate is None else rate))
            for name, rate in FLIPFLOP_SPLITS
        )
    if task == "counting":
        more = change(settings, passes=COUNTING_MORE_PASS)
        return (("in-distribution", settings), ("more pass", more))
    if task == "selective_copy":
        return tuple(
            (name, change(settings, density=min(1.0, settings.density * times)))
            for name, times in SELECTIVE_COPY_SPLITS
        )
    return ((None, settings),)


def split_notes(task: str, settings: TaskSettings) -> str:
    """What sets a split task's splits apart, in a few words for a report."""
    named = splits(task, settings)
    if task == "flipflop":
        return "ignore rates: " + ", ".join(f"{n} {s.ignore:g}" for n, s in named)
    if task == "counting":
        return "weight of pass against set 1 and increment 7: " + ", ".join(
            f"{n} {s.passes:g}" for n, s in named
        )
    if task == "selective_copy":
        return "share of positions to copy: " + ", ".join(f"{n} {s.density:g}" for n, s in named)
    return ""


def alphabet(task: str, settings: TaskSettings) -> str:
    """Every character an example of ``task`` may hold. A character tokenizer learns them all,
    so that a longer evaluation example can hold what no training one did (a count of 8 after
    training programs that never counted past 6) and still be read and answered."""
    letters = {
        "copy": SYMBOLS,
        "reverse": SYMBOLS,
        "flipflop": "wir01",
        "addition": DIGITS + "+" + (LETTERS[:HINTS] if settings.hints else ""),
        "counting": COUNTING_VARIABLES + DIGITS + ";+pas rint",
        "selective_copy": SYMBOLS + BLANK,
        "mqar": LETTERS + DIGITS + BLANK,
        "indexing": LETTERS + DIGITS + "|+-",
        "parity": "01",
        "passkey": "".join(PASSKEY_FILLER) + PASSKEY_KEY + PASSKEY_QUESTION + DIGITS,
    }[task]
    return "".join(sorted(set(letters + SEPARATOR)))


def example(
    task: str, length: int, rng: np.random.Generator, settings: TaskSettings | None = None
) -> tuple[str, str]:
    """One ``(prompt, answer)`` of ``task`` at ``length``."""
    settings = settings or TaskSettings()
    if task in GENERATORS:
        return GENERATORS[task](length, rng, settings)
    symbols = "".join(SYMBOLS[i] for i in rng.integers(0, len(SYMBOLS), size=length))
    answer = symbols if task == "copy" else symbols[::-1]
    return symbols + SEPARATOR, answer


def _flipflop(length: int, rng: np.random.Generator, settings: TaskSettings) -> tuple[str, str]:
    """A program of ``length`` >= 2 instructions: write, ``length - 2`` drawn from FFL(ignore),
    read; its prompt ends with the last ``r``, its answer is that read's bit."""
    ignore = settings.ignore
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


def _addition(length: int, rng: np.random.Generator, settings: TaskSettings) -> tuple[str, str]:
    """Two numbers of ``length`` digits and their sum: ``384+529=913``.

    Reversed (``data.addition_reversed``), every number is written least significant digit
    first, the order in which carries are made: ``483+925=319``. With index hints
    (``data.addition_hints``), every digit is preceded by a letter naming its place, counted
    from the least significant digit, in the operands and the answer alike (Zhou et al. 2023,
    "What Algorithms can Transformers Learn?", and 2024, "Transformers Can Achieve Length
    Generalization But Not Robustly"): ``c3b8a4+c5b2a9=c9b1a3``, reversed ``a4b8c3+a9b2c5=a3b1c9``.
    As Zhou et al. 2024 take a run of consecutive hints from a larger ordered set, each example
    starts its hints at a random letter, so that training shows every letter; their set is
    larger than their longest test, this one the 26 lowercase letters
    (:data:`lm.config.names.HINTS`), so a number has at most 26 digits."""
    a, b = (_number(length, rng) for _ in range(2))
    total = a + b
    start = 0
    if settings.hints:  # drawn only then: plain addition draws the numbers it always drew
        start = int(rng.integers(0, HINTS - len(str(total)) + 1))
    a_text, b_text, total_text = (_written(n, start, settings) for n in (a, b, total))
    return f"{a_text}+{b_text}{SEPARATOR}", total_text


def _written(number: int, start: int, settings: TaskSettings) -> str:
    """``number`` in addition's format: digits, reversed or not, each hinted or not."""
    places = str(number)[::-1]  # least significant first
    parts = [(LETTERS[start + i] if settings.hints else "") + d for i, d in enumerate(places)]
    return "".join(parts if settings.reversed else parts[::-1])


def _counting(length: int, rng: np.random.Generator, settings: TaskSettings) -> tuple[str, str]:
    """A program of ``length`` statements over up to ``variables`` variables, then a ``print``
    of one of them, whose value is the answer: ``x=0;pass;x++;pass;y=0;x++;print x=`` -> ``2``.

    The recipe of the paper's generator (facebookresearch/RAM, ``projects/cope/scripts/
    count_data_gen.py``), scaled down: each statement sets a variable to 0, does nothing
    (``pass``) or increments a variable already set, drawn 1 : 50 : 7; an increment that would
    pass 10 is drawn again, and the printed variable is one already set. The paper's programs
    run to 512 statements, and its generator draws until a variable has been set; at a few
    dozen statements most draws would set none, so here the first statement sets one. The
    paper's tokens are words; here they are characters, written without spaces."""
    names = COUNTING_VARIABLES[: settings.variables]
    weights = np.array([COUNTING_WEIGHTS["set"], settings.passes, COUNTING_WEIGHTS["increment"]])
    first = names[int(rng.integers(len(names)))]
    values = {first: 0}
    program = [f"{first}=0;"]
    while len(program) < length:
        kind = int(rng.choice(3, p=weights / weights.sum()))
        if kind == 0:
            name = names[int(rng.integers(len(names)))]
            values[name] = 0
            program.append(f"{name}=0;")
        elif kind == 1:
            program.append("pass;")
        else:
            name = sorted(values)[int(rng.integers(len(values)))]
            if values[name] == COUNTING_MAX:
                continue  # drawn again, as the paper's generator does
            values[name] += 1
            program.append(f"{name}++;")
    asked = sorted(values)[int(rng.integers(len(values)))]
    return "".join(program) + f"print {asked}{SEPARATOR}", str(values[asked])


def _selective_copy(
    length: int, rng: np.random.Generator, settings: TaskSettings
) -> tuple[str, str]:
    """``length`` positions, ``round(density * length)`` of them (at least one) holding a symbol
    ``a``-``j`` and the rest blank (``.``); the answer is the symbols in order:
    ``.c..a.b.=cab``. Gu & Dao 2023 (Mamba) scatter a few tokens among noise; the
    CoPE paper asks it at the trained density and at denser and sparser ones
    (:data:`SELECTIVE_COPY_SPLITS`). Here the count of symbols is fixed by the density and the
    length, so that a split changes it and nothing else."""
    count = max(1, round(settings.density * length))
    where = np.sort(rng.choice(length, size=count, replace=False))
    symbols = rng.integers(0, len(SYMBOLS), size=count)
    row = [BLANK] * length
    for place, symbol in zip(where, symbols, strict=True):
        row[place] = SYMBOLS[symbol]
    return "".join(row) + SEPARATOR, "".join(SYMBOLS[s] for s in symbols)


def _mqar(length: int, rng: np.random.Generator, settings: TaskSettings) -> tuple[str, str]:
    """``length`` key-value pairs (keys distinct letters, values digits), then a query of each
    key in a region of ``3 * length`` slots; the last query's value is the answer:
    ``a3c7b1..b=1.a=3c=`` -> ``7``.

    Zoology's recipe (HazyResearch/zoology, ``zoology/data/multiquery_ar.py``), scaled down:
    each key is queried once, at a slot i drawn without replacement with probability
    proportional to i^(a - 1), a = 0.01, so most queries come soon after the pairs and a few
    far; the slots between are blank, as Zoology's ``random_non_queries=False``. Zoology's
    model answers every query; lm's examples have one answer each, so the earlier queries are
    written with their values (``b=1``), as text the model reads, and the last one is asked.
    Zoology draws values from a vocabulary of thousands without repeats; here they are the ten
    digits, repeats allowed, and keys the 26 letters (at most 26 pairs)."""
    keys = rng.choice(len(LETTERS), size=length, replace=False)
    values = rng.integers(0, len(DIGITS), size=length)
    slots = MQAR_SLOTS * length
    weight = np.arange(1, slots + 1, dtype=float) ** (MQAR_POWER - 1)
    chosen = rng.choice(slots, size=length, replace=False, p=weight / weight.sum())
    pairs = "".join(LETTERS[k] + DIGITS[v] for k, v in zip(keys, values, strict=True))
    region = [BLANK] * slots
    for k, v, slot in zip(keys, values, chosen, strict=True):
        region[slot] = LETTERS[k] + SEPARATOR + DIGITS[v]
    last = int(chosen.max())
    asked = int(np.argmax(chosen))
    region[last] = LETTERS[keys[asked]] + SEPARATOR
    return pairs + "".join(region[: last + 1]), DIGITS[values[asked]]


def _indexing(length: int, rng: np.random.Generator, settings: TaskSettings) -> tuple[str, str]:
    """``length`` >= 2 distinct letters, then one of them and a signed offset; the answer is the
    letter that far from it: ``qdkzwe|z-2=`` -> ``d``. The PoPE paper's indirect indexing:
    finding the source letter is a match on content alone, stepping from it a
    match on position alone, which RoPE entangles. The source and the target are two different
    places drawn uniformly, so offsets run from ``-(length - 1)`` to ``length - 1``."""
    letters = [LETTERS[i] for i in rng.choice(len(LETTERS), size=length, replace=False)]
    source, target = (int(i) for i in rng.choice(length, size=2, replace=False))
    query = f"|{letters[source]}{target - source:+d}{SEPARATOR}"
    return "".join(letters) + query, letters[target]


def _parity(length: int, rng: np.random.Generator, settings: TaskSettings) -> tuple[str, str]:
    """``length`` bits and their parity, ``1`` for an odd number of ones: ``01101=1``. The parity
    check of Delétang et al. 2023 (a regular language; their transformers stay near chance),
    which Ruoss et al. 2023 test randomized positions on; both train at lengths up to 40 and test
    up to 500, here scaled down by the lengths set."""
    bits = rng.integers(0, 2, size=length)
    return "".join(DIGITS[b] for b in bits) + SEPARATOR, str(int(bits.sum()) % 2)


def _passkey(length: int, rng: np.random.Generator, settings: TaskSettings) -> tuple[str, str]:
    """``length`` characters: filler with the key sentence at a depth, the question, the key.

    Landmark attention's and PI's prompt, scaled down to a character model's context: their
    five filler sentences repeated, ``The pass key is 71432. `` (theirs goes on ``Remember it.
    71432 is the pass key.``) and ``What is the pass key? `` (theirs: ``... The pass key is``),
    then the answer ``71432``, a key of 5 digits (10000-99999). The filler is a window of the
    sentences repeated: the key sentence follows a whole sentence, drawn among the five, and
    the window is cut where the length ends it, so the filler may start and end inside a
    sentence. The key stands ``round(depth * F)`` characters into the F characters of filler
    (``settings.depth``; drawn uniformly from 0 to F when None)."""
    filler = length - PASSKEY_SHORTEST
    if filler < 0:
        raise ValueError(f"a passkey example needs {PASSKEY_SHORTEST} characters, not {length}")
    key = str(int(rng.integers(10000, 100000)))
    depth = settings.depth
    before = round(depth * filler) if depth is not None else int(rng.integers(0, filler + 1))
    cycle = "".join(PASSKEY_FILLER)
    starts = np.cumsum([0, *map(len, PASSKEY_FILLER[:-1])])
    after = int(starts[rng.integers(len(starts))])  # where the sentence after the key begins
    start = (after - before) % len(cycle)
    text = cycle * ((start + filler) // len(cycle) + 1)
    window = text[start : start + filler]
    key_sentence = PASSKEY_KEY.format(key=key)
    return window[:before] + key_sentence + window[before:] + PASSKEY_QUESTION, key


GENERATORS = {
    "flipflop": _flipflop,
    "addition": _addition,
    "counting": _counting,
    "selective_copy": _selective_copy,
    "mqar": _mqar,
    "indexing": _indexing,
    "parity": _parity,
    "passkey": _passkey,
}


def _number(digits: int, rng: np.random.Generator) -> int:
    """A number of exactly ``digits`` digits (0-9 for one digit)."""
    first = rng.integers(0 if digits == 1 else 1, 10)
    rest = rng.integers(0, 10, size=digits - 1)
    return int("".join(DIGITS[d] for d in (first, *rest)))


REPEATS_STREAM = 0x72657073
"""``builtin:repeats``' generator is seeded by ``[data.seed, this]``, a key no task's
``[data.seed, index]`` reaches (a task appended to the list keeps the repeats as they were)."""


def repeats(lengths: range, count: int, seed: int, distinct: bool = True) -> list[str]:
    """``builtin:repeats``' ``count`` documents: each ``n`` letters (``n`` drawn uniformly from
    ``lengths``) from a-z and A-Z, in random order, written twice: ``qXbqXb``.

    The data of Olsson et al. 2022's repeated random tokens, scaled to a character model: every
    letter of the second copy after its first can be predicted by an induction head (``[A][B]
    ... [A] -> [B]``). ``distinct`` (``data.repeats_distinct``): no letter twice within a
    sequence, as in ``lm heads``'s probe, so the earlier copy of a letter is unique; but then a
    letter already read is never the next in the first copy, which a model learns before
    anything else (docs/heads.md). Otherwise drawn with replacement, as Olsson's random tokens
    are: the first copy cannot be predicted (ln 52 a letter). Drawn from ``data.seed`` alone."""
    symbols = np.array(list(LETTERS + LETTERS.upper()))
    assert len(symbols) == REPEAT_SYMBOLS
    rng = np.random.default_rng([seed, REPEATS_STREAM])
    documents = []
    for _ in range(count):
        n = int(rng.choice(lengths))
        sequence = "".join(symbols[rng.choice(len(symbols), size=n, replace=not distinct)])
        documents.append(sequence + sequence)
    return documents


def training_examples(
    task: str, lengths: range, count: int, seed: int, settings: TaskSettings | None = None
) -> list[tuple[str, str]]:
    """``count`` examples, each of a length drawn uniformly from ``lengths``."""
    rng = np.random.default_rng([seed, TASKS.index(task)])
    return [example(task, int(rng.choice(lengths)), rng, settings) for _ in range(count)]


def evaluation_examples(
    task: str,
    length: int,
    count: int,
    seed: int,
    settings: TaskSettings | None = None,
    split: int = 0,
) -> list[tuple[str, str]]:
    """``count`` examples at ``length`` (in the ``split``-th of :func:`splits`, whose settings
    ``settings`` are), the same for every run with this ``seed``."""
    key = [seed, TASKS.index(task), length, 1] + ([split] if split else [])
    rng = np.random.default_rng(key)
    return [example(task, length, rng, settings) for _ in range(count)]
