"""``lm train --init-from RUN_DIR``: a new run starts from another run's weights (fresh optimizer,
step 0, the source's tokenizer); what does not fit is refused in one line before any work."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from _support import expect_error, metrics, tiny_config, varied_corpus, write_config

import lm.training.loop
from lm.cli import main
from lm.data.tokenizer import train_tokenizer
from lm.model.transformer import TransformerLM
from lm.runs.load import load_run
from lm.training.setup import config_for_init, init_weights_from


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
        (["model.d_model=64"], "model.d_model is 32 there and 64 here"),
        (["model.n_layer=3"], "model.n_layer is 2 there and 3 here"),
        (["model.position=alibi"], "model.position is 'rope' there"),
        (["model.position=learned"], "model.position is 'rope' there and 'learned' here"),
        (["model.normalize=ssmax"], "model.normalize is 'softmax' there and 'ssmax' here"),
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


def _snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_an_output_that_is_also_the_input_is_refused_before_anything_is_touched(
    source, tmp_path, capsys
):
    """``--init-from X --out X --overwrite`` once deleted X's checkpoints, config and tokenizer
    and then failed. Any spelling of the same folder is refused first, with X left as it was."""
    copy = tmp_path / "x"
    shutil.copytree(source, copy)
    (tmp_path / "link").symlink_to(copy)
    before = _snapshot(copy)
    cfg = write_config(tmp_path / "c.yaml", model={"context_length": 64})
    spellings = [str(copy), f"{copy}/", str(tmp_path / "x" / ".." / "x"), str(tmp_path / "link")]
    for out in spellings:
        for flag in ("--overwrite", "--resume"):
            argv = ["train", str(cfg), "--init-from", str(copy), "--out", out, flag]
            expect_error(capsys, argv, f"--out {Path(out)}: is --init-from", "another --out")
            assert _snapshot(copy) == before


def test_resume_of_an_imported_run_says_it_has_no_optimizer_state_and_records_nothing(
    source, tmp_path, capsys, monkeypatch
):
    pytest.importorskip("transformers")
    hf, imported = tmp_path / "hf", tmp_path / "imported"
    assert main(["export", str(source), "--out", str(hf)]) == 0
    assert main(["import", str(hf), "--out", str(imported)]) == 0
    before = _snapshot(imported)

    def no_data(*args, **kwargs):
        raise AssertionError("the data was prepared")

    monkeypatch.setattr(lm.training.loop, "prepare_data", no_data)
    capsys.readouterr()
    argv = ["train", str(imported / "config.yaml"), "--out", str(imported), "--resume"]
    expect_error(capsys, argv, "imported", "no optimizer state", f"--init-from {imported}")
    assert _snapshot(imported) == before  # run.json records no resume


def test_a_tokenizer_setting_that_init_from_replaces_gets_a_note(source, tmp_path, capsys):
    cfg = write_config(
        tmp_path / "c.yaml",
        data={"tokenizer": "bpe", "vocab_size": 300, "cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 1, "eval_every": 1, "tensorboard": False},
    )
    capsys.readouterr()
    out = tmp_path / "tuned"
    assert main(["train", str(cfg), "--out", str(out), "--init-from", str(source)]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note" in line]
    own = (source / "tokenizer.json").resolve()
    vocab = load_run(source).tokenizer.vocab_size
    assert notes == [
        f"lm: note: data.tokenizer: bpe is not used: --init-from {source} needs its own "
        f"tokenizer ({own}, {vocab} tokens), whose ids its weights know; config.yaml records it",
        "lm: note: data.vocab_size: 300 is not used: the tokenizer is not trained anew",
    ]
    data = yaml.safe_load((out / "config.yaml").read_text())["data"]
    assert data["tokenizer"] == str(own) and data["vocab_size"] is None
    # The tokenizer the source recorded, named again, needs no note.
    cfg = write_config(tmp_path / "d.yaml", train={"max_steps": 1, "eval_every": 1})
    argv = ["train", str(cfg), "--out", str(tmp_path / "again"), "--init-from", str(source)]
    assert main(argv) == 0
    assert "note" not in capsys.readouterr().err


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """A folder of two seed runs, ``seed1`` and ``seed2``, as a sweep of one value holds them."""
    root = tmp_path_factory.mktemp("init-seeds")
    cfg = write_config(
        root / "src.yaml",
        data={"cache_dir": str(root / "cache")},
        train={"max_steps": 4, "eval_every": 4, "checkpoint_every": 4, "tensorboard": False},
    )
    for seed in (1, 2):
        out = root / "runs" / f"seed{seed}"
        argv = ["train", str(cfg), "--out", str(out), "--quiet", "--set", f"train.seed={seed}"]
        assert main(argv) == 0
        assert (out / "checkpoints").is_dir()
    return root / "runs"


def _tune_config(tmp_path: Path, seeds: Path) -> Path:
    return write_config(
        tmp_path / "tune.yaml",
        model={"context_length": 64, "rope_scaling": "pi:2"},
        data={"cache_dir": str(seeds.parent / "cache")},
        train={"max_steps": 2, "eval_every": 2, "checkpoint_every": 2, "log_every": 1},
    )


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_compare_fine_tunes_each_seed_from_its_own_run(seeds, tmp_path, jobs):
    cfg = _tune_config(tmp_path, seeds)
    out = tmp_path / "tuned"
    argv = ["compare", str(cfg), "--vary", "model.rope_scaling=pi:2", "--seeds", "1,2"]
    argv += ["--init-from", str(seeds), "--jobs", jobs, "--out", str(out), "--quiet"]
    argv += ["--eval-lengths", "1x", "--eval-batches", "1", "--max-new-tokens", "1"]
    assert main(argv) == 0
    for seed in (1, 2):
        run = out / "rope_scaling=pi:2" / f"seed{seed}"
        record = json.loads((run / "run.json").read_text())
        # Seed N's run started from seed N's weights, in this process or a job's alike.
        assert record["init_from"]["run"] == str((seeds / f"seed{seed}").resolve()), run
        assert record["init_from"]["step"] == 4
        assert [m["step"] for m in metrics(run) if "train_loss" in m] == [1, 2]  # from step 0


def test_compare_init_from_without_a_seed_or_outside_a_sweep_is_refused(seeds, tmp_path, capsys):
    cfg = _tune_config(tmp_path, seeds)
    out = tmp_path / "tuned"
    argv = ["compare", str(cfg), "--vary", "model.rope_scaling=pi:2", "--seeds", "1,3"]
    err = expect_error(capsys, [*argv, "--init-from", str(seeds), "--out", str(out)], "seed3")
    assert "no run seed3 there" in err
    assert not any(out.rglob("config.yaml"))  # refused before any run trained
    expect_error(capsys, ["compare", str(seeds / "seed1"), "--init-from", str(seeds)], "--vary")
