"""A tiny fixed-seed run must keep its loss curve: a change that should not move the numbers
(a refactor, a faster kernel) shows here if it does. After a change that is meant to move them,
regenerate with ``LM_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`` and say why in the
commit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _support import losses, tiny_config

from lm.training.loop import train

GOLDEN = Path(__file__).parent / "golden" / "tiny_loss_curve.json"


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


def test_tiny_run_reproduces_the_stored_loss_curve(tmp_path):
    cfg = tiny_config(
        data={"source": str(corpus(tmp_path / "c.txt")), "split_by": "line"},
        train={"max_steps": 20, "log_every": 1, "eval_every": 10},
    )
    train(cfg, tmp_path / "run", quiet=True)
    curve = {
        "train_loss": {str(k): v for k, v in losses(tmp_path / "run").items()},
        "val_loss": {str(k): v for k, v in losses(tmp_path / "run", "val_loss").items()},
    }
    if os.environ.get("LM_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(curve, indent=1) + "\n")
    stored = json.loads(GOLDEN.read_text())
    assert stored.keys() == curve.keys()
    for key in stored:
        assert stored[key].keys() == curve[key].keys()
        for step, value in stored[key].items():
            # Tight enough to catch any change of the math, loose enough for summation order.
            assert curve[key][step] == pytest.approx(value, rel=1e-4), (key, step)
