"""Tiny fixed-seed runs must keep their numbers bit for bit: a change that should not move them
(a refactor, a faster kernel) shows here if it does. Each case pins its loss curve (every
step's training loss and each evaluation's) and the trained model's logits on a fixed window,
compared exactly: a run's numbers do not depend on the thread count (tests/test_jobs.py), so
any difference is a change of the math. The cases: the fused kernel (SDPA), the notes' formula
written out, a learned score bias, the Muon optimizer, and padded batches.

The bits depend on the CPU as well: PyTorch's and MKL's kernels add in another order with
AVX-512 than with AVX2, and on Intel than on AMD. So the numbers are kept per machine kind
(:func:`machine_kind`) and compared exactly on a kind that has them; on another
kind, near enough to a kind kept (:func:`close`; a change of the math moves them by more). After a
change that is meant to move them, regenerate on each kind at hand with ``LM_UPDATE_GOLDEN=1
python -m pytest -n 0 tests/test_golden.py`` (which rewrites this kind's) and say why in the
commit."""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

import pytest
import torch
from _support import losses, tiny_config

from lm.runs.load import load_run
from lm.training.loop import train

GOLDEN = Path(__file__).parent / "golden" / "tiny_runs.json"

# (sections over tests/_support.TINY, steps): each small enough to train in a second or two.
CASES = {
    "fused": ({"model": {"kernel": "sdpa"}}, 20),
    "explicit": ({"model": {"kernel": "math"}}, 10),
    "learned-bias": ({"model": {"position": "t5"}}, 10),
    "muon": ({"train": {"optimizer": "muon"}}, 10),
    "padded": ({"data": {"mode": "padded"}}, 10),
}


def corpus(path: Path) -> Path:
    words = [
        "the",
        "notes",
        "define",
        "attention",
        "as",
        "a",
        "soft",
        "lookup",
        "queries",
        "keys",
        "values",
        "rotate",
        "position",
    ]
    lines = [
        " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(5 + i % 9)) for i in range(400)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def numbers(run_dir: Path) -> dict:
    """What a case pins: its losses, and its trained model's logits on one fixed window."""
    run = load_run(run_dir)
    ids = torch.arange(12).remainder(run.config.model.vocab_size)[None]
    with torch.no_grad():
        logits = run.model(ids)[0, -4:]  # (4, vocab): the last positions read every earlier one
    return {
        "train_loss": {str(k): v for k, v in losses(run_dir).items()},
        "val_loss": {str(k): v for k, v in losses(run_dir, "val_loss").items()},
        "logits": logits.tolist(),
    }


@pytest.mark.parametrize("case", CASES)
def test_a_tiny_run_reproduces_its_stored_numbers_exactly(case, tmp_path):
    sections, steps = CASES[case]
    data = {"source": str(corpus(tmp_path / "c.txt")), "split_by": "line"}
    cfg = tiny_config(
        model=sections.get("model", {}),
        data={**data, **sections.get("data", {})},
        train={"max_steps": steps, "log_every": 1, "eval_every": steps // 2,
               **sections.get("train", {})},
    )  # fmt: skip
    train(cfg, tmp_path / "run", quiet=True)
    got = numbers(tmp_path / "run")
    assert len(got["train_loss"]) == steps and len(got["val_loss"]) == 2
    stored = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    kind = machine_kind()
    if os.environ.get("LM_UPDATE_GOLDEN"):
        stored.setdefault(kind, {})[case] = got
        stored[kind] = dict(sorted(stored[kind].items()))
        GOLDEN.write_text(json.dumps(dict(sorted(stored.items())), indent=1) + "\n")
    if case in stored.get(kind, {}):
        assert flat(got) == flat(stored[kind][case])  # every float, bit for bit
        return
    kept = [k for k in stored if case in stored[k]]
    assert kept, f"no machine kind has {case}'s numbers: regenerate (module docstring)"
    for other in kept:
        want = flat(stored[other][case])
        assert flat(got).keys() == want.keys()
        if all(close(k[0], v, want[k]) for k, v in flat(got).items()):
            return
    pytest.fail(f"{case}: the numbers are near those of no kind kept ({', '.join(kept)})")


def close(key: str, got: float, want: float) -> bool:
    """Losses to rtol 1e-4; logits (of size about 1) to 0.01, since Muon's iteration runs in
    bf16 where the CPU has it (lm/training/optim.py) and moves them by up to 0.004."""
    if key == "logits":
        return abs(got - want) <= 1e-2
    return math.isclose(got, want, rel_tol=1e-4)


def machine_kind() -> str:
    """The CPU, as finely as its kernels can differ: vendor, family and model (one model runs the
    same MKL and oneDNN code paths), and the instructions PyTorch uses on it, ``GenuineIntel 6/167
    AVX512``."""
    fields = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    vendor = fields.get("vendor_id", "unknown")
    model = f"{fields.get('cpu family', '?')}/{fields.get('model', '?')}"
    return f"{vendor} {model} {torch.backends.cpu.get_cpu_capability()}"


def flat(numbers: dict) -> dict[tuple, float]:
    """Every number of a case by its place: (key, step) for losses, (logits, i, j)."""
    out = {(key, step): v for key in ("train_loss", "val_loss") for step, v in numbers[key].items()}
    for i, row in enumerate(numbers["logits"]):
        out.update({("logits", i, j): v for j, v in enumerate(row)})
    return out
