"""The command line end to end: train, sample, eval; one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _support import expect_error, metrics, train_via_cli, write_config

from lm.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    train_via_cli(root)
    return root


def test_train_through_the_cli_logs_and_loss_falls(trained):
    lines = [m for m in metrics(trained / "run") if "train_loss" in m]
    assert lines[-1]["train_loss"] < lines[0]["train_loss"]
    assert (trained / "run" / "checkpoints").is_dir()


def test_sample_prints_only_the_texts_on_stdout(trained, capsys):
    code = main(
        [
            "sample",
            str(trained / "run"),
            "--prompt",
            "def f",
            "--prompt",
            "The ",
            "--max-new-tokens",
            "20",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    first, second = out.split("\n\n", 1)
    assert first.startswith("def f") and second.startswith("The ")
    assert len(first) > len("def f")


def test_eval_prints_a_table_and_writes_json(trained, capsys):
    code = main(["eval", str(trained / "run"), "--context-lengths", "32,64", "--max-batches", "3"])
    out = capsys.readouterr().out
    assert code == 0 and "| 32 |" in out and "| 64 |" in out
    rows = json.loads((trained / "run" / "eval.json").read_text())["rows"]
    assert [r["context_length"] for r in rows] == [32, 64]
    assert all(r["loss"] > 0 for r in rows)


def test_set_overrides_and_their_errors(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml")
    args = ["--set", "train.max_steps=3", "model.position=alibi", "--set", "train.max_steps=4"]
    code = main(["train", str(cfg), "--out", str(tmp_path / "r"), "--quiet", *args])
    assert code == 0
    resolved = (tmp_path / "r" / "config.yaml").read_text()
    assert "position: alibi" in resolved and "max_steps: 4" in resolved
    capsys.readouterr()
    for bad, message in [
        ("model.n_head=x", "model.n_head: expected an integer"),
        ("model.heads=2", "model.heads: unknown key"),
        ("nosection=1", "expected SECTION.KEY"),
    ]:
        expect_error(
            capsys, ["train", str(cfg), "--out", str(tmp_path / "bad"), "--set", bad], message
        )
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "missing.yaml"], "no such config file"),
        (["sample", "no/such/run", "--prompt", "x"], "no such run directory"),
        (["sample", "x"], "the following arguments are required: --prompt"),
        (["eval", "x", "--context-lengths", "a,b"], "not a comma-separated list"),
        (["train"], "the following arguments are required: config"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    expect_error(capsys, argv, message)


def test_python_dash_m_and_help():
    out = subprocess.run([sys.executable, "-m", "lm", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "train" in out.stdout and "sample" in out.stdout
    for cmd in ("train", "sample", "eval"):
        sub = subprocess.run(
            [sys.executable, "-m", "lm", cmd, "--help"], capture_output=True, text=True
        )
        assert sub.returncode == 0 and "usage: lm " + cmd in sub.stdout


def test_prompt_dash_reads_standard_input(trained):
    cmd = [sys.executable, "-m", "lm", "sample", str(trained / "run"), "--prompt", "-"]
    out = subprocess.run(
        [*cmd, "--max-new-tokens", "5"], input="class A", capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("class A") and len(out.stdout) > len("class A\n")
