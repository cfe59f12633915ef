"""Fine-tuning a run to a longer context (issue 15, step 3): ``lm train CONFIG --init-from RUN``
starts from the run's weights with a fresh optimizer at step 0, may change the context length
and ``rope_scaling``, and refuses weights of another shape in one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _support import expect_error, losses, metrics, nan_loss_at_step, write_config
from safetensors.torch import load_file

from lm.cli import main
from lm.runs.checkpoint import latest_checkpoint


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(latest_checkpoint(run) / "model.safetensors"))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A tiny RoPE run trained at context 32."""
    root = tmp_path_factory.mktemp("source")
    cfg = write_config(root / "c.yaml", data={"cache_dir": str(root / "cache")})
    assert main(["train", str(cfg), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


def extend(tmp_path: Path, source: Path, out: str, *args: str, **train) -> list[str]:
    """``lm train`` argv that continues ``source`` at 2x its context with PI."""
    cfg = write_config(
        tmp_path / f"{out}.yaml",
        model={"context_length": 64, "rope_scaling": "pi:2"},
        data={"cache_dir": str(source.parent / "cache")},
        train={"max_steps": 8, "checkpoint_every": 4, "eval_every": 4, "log_every": 1, **train},
    )
    return ["train", str(cfg), "--out", str(tmp_path / out), "--quiet", *args]


def test_init_from_loads_the_weights_exactly_at_step_0_with_a_fresh_optimizer(source, tmp_path):
    # A learning rate so small that one step cannot move a weight by 1e-9: what the step-1
    # checkpoint holds is what was loaded.
    tiny = {"max_steps": 1, "lr": 1e-12, "min_lr": 1e-12, "weight_decay": 0.0, "warmup_steps": 0}
    argv = extend(tmp_path, source, "ft", "--init-from", str(source), **tiny)
    assert main(argv) == 0
    run = tmp_path / "ft"
    assert latest_checkpoint(run).name == "step_00000001"  # counted from 0, not from the source
    got, want = weights(run), weights(source)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-9, msg=name)
    assert (run / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert "rope_scaling: pi:2" in (run / "config.yaml").read_text()
    # Training goes on from where the source left off (a fresh model starts near ln(vocab)).
    first = next(m["train_loss"] for m in metrics(run) if "train_loss" in m)
    trained = [m["train_loss"] for m in metrics(source) if "train_loss" in m][-1]
    assert first < trained + 0.5


def test_init_from_refuses_weights_of_another_shape_in_one_line(tmp_path, capsys):
    root = tmp_path / "learned"
    cfg = write_config(
        root.with_suffix(".yaml"),
        model={"position": "learned"},
        data={"cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 2},
    )
    assert main(["train", str(cfg), "--out", str(root), "--quiet"]) == 0
    longer = write_config(
        tmp_path / "longer.yaml",
        model={"position": "learned", "context_length": 64},
        data={"cache_dir": str(tmp_path / "cache")},
    )
    # A learned table of 32 positions cannot become one of 64: the message names it.
    argv = ["train", str(longer), "--out", str(tmp_path / "x"), "--init-from", str(root)]
    expect_error(capsys, argv, "pos_embed")


def test_resuming_a_run_started_with_init_from_is_exact(source, tmp_path, monkeypatch):
    assert main(extend(tmp_path, source, "straight", "--init-from", str(source))) == 0
    with nan_loss_at_step(6):  # a crash between checkpoints 4 and 8
        main(extend(tmp_path, source, "resumed", "--init-from", str(source)))
    assert latest_checkpoint(tmp_path / "resumed").name == "step_00000004"
    assert main(extend(tmp_path, source, "resumed", "--resume")) == 0
    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")
    assert losses(tmp_path / "resumed", "val_loss") == losses(tmp_path / "straight", "val_loss")
    got, want = weights(tmp_path / "resumed"), weights(tmp_path / "straight")
    assert all(torch.equal(got[k], want[k]) for k in want)
