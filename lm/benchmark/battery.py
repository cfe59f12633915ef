"""The battery ``lm bench`` runs, the same for every scheme: the length curve on the embedded
corpus and the tasks on which the ledger's schemes separate (docs/claims.md), each from its
``configs/*.yaml`` with the battery's budget, and each benchmark's headline scores.

Every run pins ``train.dtype: fp32``, ``model.kernel: sdpa`` and the CPU, as the ledger's configs
do, so that a score does not depend on the machine's auto rule. The budgets are sized by
arithmetic from milliseconds per training step measured alone on the project's 2-core CPU (AMD
EPYC, fp32 sdpa): 14.4 at flip-flop's shape (2 layers of width 64, context 64, batch 32) and
38.2 at the length curve's (4 layers of width 128, context 64, batch 16); a task's padded rows
cost about their mean width (docs/bench.md has the sums). ``full`` is 3 seeds of the larger
budgets, ``quick`` 1 seed of smaller ones and fewer evaluation examples, without passkey. The
full battery's recall and passkey train at the ledger's budgets, the smallest at which RoPE was
measured to learn them (docs/bench.md, "Where the full battery separates").
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm.config.errors import LMError
from lm.config.names import POSITIONS

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
"""The repository's configs, the battery's bases."""
PINNED = (
    "train.dtype=fp32",
    "model.kernel=sdpa",
    "train.device=cpu",
    "train.compile=false",
    "train.eval_every=0",
    "train.checkpoint_every=0",
)
SEEDS = {"full": (1, 2, 3), "quick": (1,)}
BUILTINS: dict[str, tuple[str, tuple[str, ...]]] = {
    **{name: (name, ()) for name in POSITIONS},
    "p-rope": ("rope", ("model.rope_p=0.25",)),
}
"""The builtin schemes the references hold, by the name the card gives each: its
``model.position`` and settings. Every ``model.position`` value as itself, and p-RoPE (Barbero et
al. 2025: a quarter of each head's pairs rotate, the rest carry no position) as the ledger runs
it."""


def builtin_of(position: str, settings: list[str] | tuple[str, ...]) -> str | None:
    """The builtin a ``--position`` and ``--set`` bench (``rope`` with ``model.rope_p=0.25``:
    ``p-rope``), or None."""
    wanted = (position, tuple(sorted(settings)))
    return next((n for n, (p, s) in BUILTINS.items() if (p, tuple(sorted(s))) == wanted), None)


@dataclass(frozen=True)
class Score:
    """One headline number of a benchmark. ``what``: ``loss`` (validation loss, mean over the
    lengths from 2x the trained context on; lower is better), ``accuracy`` (exact match, the
    mean over the rows of ``split``, only past the trained lengths with ``unseen``; a length out
    of the model's reach counts 0) or ``k_max`` (passkey's, 0 where the shortest length
    fails)."""

    name: str
    what: str
    split: str | None = None
    unseen: bool = False

    @property
    def higher_is_better(self) -> bool:
        return self.what != "loss"

    @property
    def resolution(self) -> float:
        """Differences smaller than this are level: a thousandth of a nat or of the examples,
        or no length step of k_max."""
        return 1.0 if self.what == "k_max" else 0.001

    def id(self, benchmark: Benchmark) -> str:
        """How a card and the references name it: ``benchmark: score``."""
        return f"{benchmark.name}: {self.name}"

    def text(self, value: float | None) -> str:
        """As the card writes it: a loss to 3 decimals, an accuracy in percent, k_max whole."""
        if value is None:
            return "n/a"
        if self.what == "loss":
            return f"{value:.3f}"
        return f"{value:.0f}" if self.what == "k_max" else f"{value:.1%}"

    def of(self, extrapolation: list[dict[str, Any]], accuracy: list[dict[str, Any]] | None):
        """This score of one run, from what lm compare measured of it; None where the run has
        none (a learned table past its rows)."""
        if self.what == "loss":
            losses = [r["loss"] for r in extrapolation if factor(r["requested"]) >= 2]
            return None if None in losses or not losses else statistics.fmean(losses)
        rows = accuracy or []
        if self.what == "k_max":
            from lm.evaluate import k_max  # the evaluation's own rule

            return float(k_max(rows) or 0)
        trained = max((r["length"] for r in rows if r["trained"]), default=0)
        chosen = [
            r["accuracy"]
            for r in rows
            if r.get("split") == self.split and (not self.unseen or r["length"] > trained)
        ]
        # A length the model cannot read (a learned table past its rows) answers nothing.
        return statistics.fmean(0.0 if a is None else a for a in chosen) if chosen else None


def factor(requested: str) -> float:
    """``"1.5x"`` -> 1.5: a curve length as a multiple of the trained context."""
    return float(requested.removesuffix("x"))


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its base config, its settings in each battery and its scores."""

    name: str
    config: str
    scores: tuple[Score, ...]
    full: tuple[str, ...]
    quick: tuple[str, ...] | None
    """None: not in the quick battery."""
    lengths: tuple[str, ...] = ()
    """The length curve's evaluation lengths (a task's accuracy has its own)."""
    quick_batches: int | None = None
    """The curve's evaluation batches per length in the quick battery (full: the whole split)."""

    def settings(self, battery: str) -> tuple[str, ...]:
        return (*PINNED, *(self.full if battery == "full" else self.quick))

    def path(self) -> Path:
        path = CONFIGS / self.config
        if not path.is_file():
            raise LMError(
                f"lm bench: {path} is missing; the battery's configs are the repository's "
                "configs/ (run lm bench from a checkout of lm)"
            )
        return path


CURVE = Benchmark(
    "length curve",
    "extrapolation.yaml",
    (Score("loss 2x-8x", "loss"),),
    full=("train.batch_size=16", "train.max_steps=600"),
    quick=("train.batch_size=16", "train.max_steps=250"),
    lengths=("1x", "1.5x", "2x", "3x", "4x", "8x"),
    quick_batches=4,
)
BATTERY = (
    CURVE,
    Benchmark(
        "flip-flop",
        "flipflop.yaml",
        (Score("sparse", "accuracy", split="sparse"),),
        full=("train.max_steps=1500",),
        quick=("train.max_steps=600", "data.task_eval_examples=200"),
    ),
    Benchmark(
        "counting",
        "counting.yaml",
        (Score("17-32 statements", "accuracy", split="in-distribution", unseen=True),),
        full=("train.max_steps=1500",),
        quick=("train.max_steps=500", "data.task_eval_examples=30"),
    ),
    Benchmark(
        "selective copy",
        "selective_copy.yaml",
        (Score("sparse, 17-32", "accuracy", split="sparse", unseen=True),),
        full=("train.max_steps=1000",),
        quick=("train.max_steps=500", "data.task_eval_examples=30"),
    ),
    Benchmark(
        "recall",
        "mqar.yaml",
        (Score("9-16 pairs", "accuracy", unseen=True),),
        # Recall past the trained pairs needs the ledger's budget: at 1500 steps of lr 3e-3 RoPE
        # answered 14% (chance 10%); at 6000 of 1e-3 RoPE 55%, no positions 88% (docs/bench.md).
        full=("train.max_steps=6000", "train.lr=1e-3"),
        quick=("train.max_steps=600", "train.lr=3e-3", "data.task_eval_examples=50"),
    ),
    Benchmark(
        "parity",
        "parity.yaml",
        (Score("9-16 bits", "accuracy", unseen=True),),
        full=("train.max_steps=3000",),
        quick=("train.max_steps=1500", "data.task_eval_examples=50"),
    ),
    Benchmark(
        "passkey",
        "passkey_base.yaml",
        (Score("mean accuracy", "accuracy"), Score("k_max", "k_max")),
        # The ledger's base runs (context 64, batch 64, lr 2e-3), which retrieve at the trained
        # length; passkey.yaml's context of 128 retrieved 1.8% after 1500 steps (docs/bench.md).
        full=("train.max_steps=2000", "data.task_eval_examples=50"),
        quick=None,  # no scheme retrieves at a quick budget (passkey.yaml: RoPE 0% after 600 steps)
    ),
)
"""The battery, in the order it runs and the card reads."""


def benchmarks(battery: str) -> tuple[Benchmark, ...]:
    """The benchmarks of the ``full`` or ``quick`` battery, in the order they run."""
    return tuple(b for b in BATTERY if battery == "full" or b.quick is not None)


def scores() -> dict[str, Score]:
    """Every score of the battery by its id, in the card's order."""
    return {s.id(b): s for b in BATTERY for s in b.scores}
