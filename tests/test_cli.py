"""The command line end to end: train, sample, eval; one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
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


def test_eval_takes_multiples_of_the_context_and_says_what_it_read(trained, capsys):
    run = trained / "run"
    assert main(["eval", str(run), "--context-lengths", "1x,1.5x,64,100000"]) == 0
    out = capsys.readouterr().out
    rows = json.loads((run / "eval.json").read_text())["rows"]
    assert [(r["context_length"], r["requested"]) for r in rows] == [
        (32, "1x"),
        (48, "1.5x"),
        (64, "64"),
        (100000, "100000"),
    ]
    n = rows[0]["tokens"] + 1  # the validation split's tokens: every one but the first a target
    assert all(r["tokens"] == n - 1 for r in rows)  # the whole split at every length
    assert rows[0]["windows"] == -(-(n - 1) // 32) and rows[0]["window"] == 32
    assert "note" not in rows[0]
    longest = rows[-1]
    assert longest["windows"] == 1 and longest["window"] == n - 1
    assert longest["note"] == (
        f"no window of the val split reaches 100000 tokens: 1 window(s), the longest {n - 1}"
    )
    assert f"100000: {longest['note']}" in out


def test_eval_and_sample_with_a_rope_extension_at_evaluation_time(trained, capsys):
    from lm.evaluate import load_with_rope_scaling
    from lm.model.schemes.rope import RopeAngles

    run = trained / "run"
    args = ["--context-lengths", "2x", "--max-batches", "2"]
    assert main(["eval", str(run), *args]) == 0
    plain = json.loads((run / "eval.json").read_text())
    assert plain["rope_scaling"] is None
    # One result per setting, each table naming its setting; eval.json stays the run as trained.
    for method in ("pi:2", "ntk:2", "yarn:2"):
        capsys.readouterr()
        assert main(["eval", str(run), *args, "--rope-scaling", method]) == 0
        path = run / f"eval.{method.replace(':', '_')}.json"
        first = capsys.readouterr().out.splitlines()[0]
        assert first == (
            f"rope_scaling {method} at evaluation time, in place of the trained none ({path})"
        )
        assert json.loads(path.read_text())["rope_scaling"] == method
    assert json.loads((run / "eval.json").read_text()) == plain
    assert main(["eval", str(run), *args, "--rope-scaling", "none"]) == 0
    assert json.loads((run / "eval.json").read_text())["rows"] == plain["rows"]  # as trained
    assert sorted(p.name for p in run.glob("eval*.json")) == [
        "eval.json",
        "eval.ntk_2.json",
        "eval.pi_2.json",
        "eval.yarn_2.json",
    ]
    # The same weights; only the angles change, YaRN's L being the trained context.
    trained_model = load_with_rope_scaling(run).model
    extended = load_with_rope_scaling(run, rope_scaling="yarn:2").model
    assert extended.config.rope_scaling == "yarn:2" and extended.config.context_length == 32
    assert extended.blocks[0].attn.position.rope == RopeAngles(
        16, method="yarn", factor=2.0, context=32
    )
    weights = trained_model.state_dict()
    assert all(torch.equal(t, weights[k]) for k, t in extended.state_dict().items())
    cos = [m.blocks[0].attn.position.cos for m in (extended, trained_model)]
    assert not torch.equal(*cos)
    capsys.readouterr()
    argv = ["sample", str(run), "--prompt", "def f", "--max-new-tokens", "8"]
    assert main([*argv, "--rope-scaling", "yarn:2"]) == 0
    assert capsys.readouterr().out.startswith("def f")


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
        (["eval", "x", "--context-lengths", "1.5"], "not a comma-separated list of lengths"),
        (["eval", "x", "--context-lengths", "1"], "'1': a length in tokens must be at least 2"),
        (["eval", "x", "--context-lengths", "0x"], "'0x' is not a positive multiple"),
        (["eval", "x", "--rope-scaling", "spiral:4"], "--rope-scaling: 'spiral:4' is not one of"),
        (["eval", "x", "--rope-scaling", "pi:0"], "the factor of 'pi:0' must be a number >= 1"),
        (["sample", "x", "--prompt", "a", "--rope-scaling", "yarn:x"], "is not a number"),
        (["train"], "the following arguments are required: config"),
        (["frobnicate"], "invalid choice"),
        (["sample", "x", "--prompt", "a", "--device=--"], "--device: expected a value, not '--'"),
        (["train", "missing.yaml", "--out=--"], "--out: expected a value, not '--'"),
        (["compare", "x", "--jobs=--"], "--jobs: expected a value, not '--'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    expect_error(capsys, argv, message)


def test_a_mistyped_command_is_not_offered_lm_compares_own(capsys):
    err = expect_error(capsys, ["trian"], "invalid choice: 'trian' (choose from 'train', 'sample'")
    assert "job-" not in err and "'choices')" in err


def test_rope_settings_in_a_training_config_are_refused_in_one_line(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml")
    for setting, message in [
        ("model.rope_scaling=yarn", "model.rope_scaling: 'yarn' needs a factor"),
        ("model.rope_scaling=pi:-1", "must be a number >= 1"),
        ("model.position=alibi model.rope_scaling=ntk:2", "this model uses position: alibi"),
    ]:
        out = tmp_path / "r"
        expect_error(
            capsys, ["train", str(cfg), "--out", str(out), "--set", *setting.split()], message
        )
        assert not out.exists()


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
