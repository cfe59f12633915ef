"""TensorBoard event files: the same numbers as metrics.jsonl, read back with tensorboard's own
reader; the config as hyperparameters; a resume hides what its checkpoint did not keep."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
from _support import metrics, tiny_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from lm.config.errors import ConfigError
from lm.config.load import load_config
from lm.training.board import EVENTS_GLOB
from lm.training.loop import train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """One token-id cache for the module: the tests differ in logging, not in data."""
    return {"cache_dir": str(tmp_path_factory.mktemp("board-data"))}


def read_board(run_dir) -> EventAccumulator:
    board = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    board.Reload()
    return board


def assert_board_equals_metrics(run_dir) -> None:
    board = read_board(run_dir)
    records = metrics(run_dir)

    def number(v):  # what a board holds: numbers (a sitting's status line is words)
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    # Each head's score is its own scalar: heads/<score>/L<layer>H<head> (docs/heads.md).
    records = [{**r, **_head_tags(r.pop("heads", {}))} for r in records]
    tags = {k for r in records for k, v in r.items() if k != "step" and number(v)}
    assert set(board.Tags()["scalars"]) == tags
    for tag in tags:
        want = [(r["step"], np.float32(r[tag])) for r in records if number(r.get(tag))]
        got = [(e.step, np.float32(e.value)) for e in board.Scalars(tag)]
        assert got == want, tag


def _head_tags(heads: dict) -> dict:
    return {
        f"heads/{score}/L{layer}H{head}": value
        for score, table in heads.items()
        for layer, row in enumerate(table)
        for head, value in enumerate(row)
    }


def test_event_files_hold_the_metrics_and_the_config(tmp_path, data):
    cfg = tiny_config(
        model={"position": "alibi"},
        data=data,
        train={"max_steps": 10, "eval_every": 5, "tensorboard": True},
    )
    run_dir = tmp_path / "position=alibi" / "seed7"
    train(cfg, run_dir, quiet=True)
    assert list(run_dir.glob(EVENTS_GLOB))  # in the run folder: TensorBoard names it so
    assert_board_equals_metrics(run_dir)
    assert {"train_loss", "val_loss", "lr", "tokens_per_s", "grad_norm"} <= set(
        read_board(run_dir).Tags()["scalars"]
    )

    content = read_board(run_dir).PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["model.position"].string_value == "alibi"
    assert hparams["train.lr"].number_value == pytest.approx(3e-3)
    assert hparams["train.compile"].string_value == "false"


def test_a_resumed_run_hides_the_steps_its_checkpoint_lost(tmp_path, data):
    cfg = tiny_config(
        data=data,
        train={"max_steps": 20, "checkpoint_every": 10, "eval_every": 10, "tensorboard": True},
    )
    run_dir = tmp_path / "run"
    train(cfg, run_dir, quiet=True)
    # As if the process died after logging step 20 but before saving it.
    shutil.rmtree(run_dir / "checkpoints" / "step_00000020")
    train(cfg, run_dir, resume=True, quiet=True)
    assert len(list(run_dir.glob(EVENTS_GLOB))) == 2
    assert_board_equals_metrics(run_dir)  # one value per step: the resumed run's

    # A fresh start leaves no curve of the earlier attempt behind.
    shorter = cfg.replace(train=dataclasses.replace(cfg.train, max_steps=5))
    train(shorter, run_dir, overwrite=True, quiet=True)
    assert len(list(run_dir.glob(EVENTS_GLOB))) == 1
    assert_board_equals_metrics(run_dir)


def test_tensorboard_false_writes_nothing_and_the_key_is_checked(tmp_path, data):
    cfg = tiny_config(data=data, train={"max_steps": 2, "eval_every": 2, "tensorboard": False})
    train(cfg, tmp_path / "run", quiet=True)
    assert not list((tmp_path / "run").glob(EVENTS_GLOB))
    assert tiny_config(train={"tensorboard": True}).train.tensorboard is True
    assert tiny_config().train.tensorboard is None
    with pytest.raises(ConfigError, match=r"train\.tensorboard: expected true or false"):
        load_config(None, ["train.tensorboard=sometimes"])


def test_without_the_package_auto_writes_nothing_and_true_is_refused(tmp_path, data, monkeypatch):
    monkeypatch.setattr("lm.training.board.tensorboard_installed", lambda: False)
    cfg = tiny_config(data=data, train={"max_steps": 2, "eval_every": 2})
    assert train(cfg, tmp_path / "auto", quiet=True).status == "done"
    assert not list((tmp_path / "auto").glob(EVENTS_GLOB))
    insist = cfg.replace(train=dataclasses.replace(cfg.train, tensorboard=True))
    with pytest.raises(ConfigError, match="tensorboard package is not installed"):
        train(insist, tmp_path / "true", quiet=True)
    assert not (tmp_path / "true" / "metrics.jsonl").exists()  # no run recorded as started
