"""``lm train --init-from RUN_DIR``: a new run starts from another run's weights (fresh optimizer,
step 0, the source's tokenizer); what does not fit is refused in one line before any work."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from _support import metrics, tiny_config, varied_corpus, write_config

from lm.cli import main
from lm.model import TransformerLM
from lm.runs import config_for_init, init_weights_from, load_run
from lm.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("init-source")
    cfg = write_config(
        root / "src.yaml",
        data={"cache_dir": str(root / "cache")},
        train={"max_steps": 20, "eval_every": 20, "checkpoint_every": 20, "tensorboard": False},
    )
    assert main(["train", str(cfg), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


def test_init_weights_from_loads_the_newest_weights_exactly(source):
    src = load_run(source)
    cfg = config_for_init(tiny_config(model={"context_length": 64}), source)
    assert cfg.data.tokenizer == str((source / "tokenizer.json").resolve())
    model = TransformerLM(dataclasses.replace(cfg.model, vocab_size=src.tokenizer.vocab_size))
    init_weights_from(model, source)
    for name, tensor in src.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_a_run_starts_from_another_on_new_data_and_context(source, tmp_path):
    corpus = varied_corpus(tmp_path / "docs.jsonl")
    cfg = write_config(
        tmp_path / "tune.yaml",
        model={"context_length": 64},
        data={"source": str(corpus), "cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 5, "log_every": 1, "eval_every": 5, "tensorboard": False},
    )
    tuned = tmp_path / "tuned"
    argv = ["train", str(cfg), "--out", str(tuned), "--quiet", "--init-from", str(source)]
    assert main(argv) == 0
    # The source's tokenizer, so the ids mean what the weights learned.
    assert (tuned / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    record = json.loads((tuned / "run.json").read_text())
    assert record["init_from"] == {
        "run": str(source.resolve()),
        "checkpoint": "step_00000020",
        "step": 20,
    }
    lines = [m for m in metrics(tuned) if "train_loss" in m]
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5]  # step 0 again: a fresh schedule

    # From scratch, the same config starts far higher: the weights really came in.
    fresh = tmp_path / "fresh"
    own = f"data.tokenizer={source / 'tokenizer.json'}"
    argv = ["train", str(cfg), "--out", str(fresh), "--quiet", "--set", own]
    assert main(argv) == 0
    first = next(m for m in metrics(fresh) if "train_loss" in m)["train_loss"]
    assert lines[0]["train_loss"] < first - 0.5


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["model.d_model=64"], "parameter embed.weight has shape"),
        (["model.n_layer=3"], "parameter blocks.2.norm1.weight is not in its weights"),
        (["model.position=alibi"], "model.position is 'rope' there"),
        (["model.position=learned"], "parameter pos_embed.weight is not in its weights"),
    ],
)
def test_what_does_not_fit_is_refused_in_one_line(source, tmp_path, capsys, sets, needle):
    cfg = write_config(tmp_path / "c.yaml", data={"cache_dir": str(tmp_path / "cache")})
    out = tmp_path / "run"
    capsys.readouterr()
    argv = ["train", str(cfg), "--out", str(out), "--init-from", str(source), "--set", *sets]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("lm: error: ") and err.count("\n") == 1 and needle in err, err
    assert not out.exists()


def test_learned_table_must_keep_its_length(tmp_path, capsys):
    src_cfg = write_config(
        tmp_path / "src.yaml",
        model={"position": "learned"},
        data={"cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 2, "eval_every": 2, "tensorboard": False},
    )
    assert main(["train", str(src_cfg), "--out", str(tmp_path / "src"), "--quiet"]) == 0
    argv = [
        "train",
        str(src_cfg),
        "--out",
        str(tmp_path / "long"),
        "--init-from",
        str(tmp_path / "src"),
        "--set",
        "model.context_length=64",
    ]
    capsys.readouterr()
    assert main(argv) == 2
    assert "pos_embed.weight has shape [32, 32] there but [64, 32]" in capsys.readouterr().err


def test_another_tokenizer_or_a_non_run_is_refused(source, tmp_path, capsys):
    other = tmp_path / "other.json"
    train_tokenizer("byte", ()).save(other)
    cfg = write_config(tmp_path / "c.yaml", data={"tokenizer": str(other)})
    capsys.readouterr()
    argv = ["train", str(cfg), "--out", str(tmp_path / "r"), "--init-from", str(source)]
    assert main(argv) == 2
    assert "is not the tokenizer of --init-from" in capsys.readouterr().err
    argv = ["train", str(cfg), "--out", str(tmp_path / "r"), "--init-from", str(tmp_path)]
    assert main(argv) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
