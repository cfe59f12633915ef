"""A new user's mistakes (issue 12): each is one line on standard error and exit status 2, and
what the messages claim holds."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from _export_support import untrained_run
from _support import expect_error, train_via_cli, write_config

from lm.cli import _read_prompts, main
from lm.config.load import load_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_via_cli(tmp_path_factory.mktemp("newuser"), max_steps=20)


def _commands(run):
    return {
        "sample": ["sample", str(run), "--prompt", "x", "--max-new-tokens", "2"],
        "eval": ["eval", str(run), "--max-batches", "1"],
        "attention": ["attention", str(run), "--text", "ab"],
        "positions": ["positions", str(run), "--windows", "1"],
        "compare": ["compare", str(run), "--max-new-tokens", "2", "--eval-batches", "1"],
    }


@pytest.mark.parametrize("device", ["gpu", "meta", "cuda:x", "cpu:0"])
@pytest.mark.parametrize("command", ["sample", "eval", "attention", "positions", "compare"])
def test_a_device_that_is_not_one_is_named_by_its_flag(run, capsys, command, device):
    err = expect_error(capsys, [*_commands(run)[command], "--device", device], "--device")
    assert "train.device" not in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_blames_the_flag(run, capsys):
    err = expect_error(capsys, [*_commands(run)["sample"], "--device", "cuda"], "--device", "CUDA")
    assert "train.device" not in err


def test_output_paths_under_a_file_are_refused(run, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    cfg = write_config(tmp_path / "c.yaml")
    expect_error(capsys, ["train", str(cfg), "--out", str(afile)], "--out", "is a file")
    expect_error(capsys, ["train", str(cfg), "--out", str(afile / "x")], "--out", "a file")
    vary = ["--vary", "model.position=rope,alibi"]
    expect_error(capsys, ["compare", str(cfg), *vary, "--out", str(afile)], "--out")
    expect_error(capsys, ["compare", str(run), "--out", str(afile)], "--out", "is a file")
    for command in ("attention", "positions"):
        argv = [*_commands(run)[command], "--out", str(afile / "x.png")]
        expect_error(capsys, argv, "--out", "a file")
    expect_error(capsys, [*_commands(run)["attention"], "--out", str(tmp_path)], "is a folder")
    assert afile.read_text() == "keep me"


@pytest.mark.parametrize("name", ["att.txt", "att", "att.PNGX"])
def test_a_picture_format_matplotlib_does_not_write_is_refused(run, tmp_path, capsys, name):
    out = str(tmp_path / name)
    expect_error(capsys, [*_commands(run)["attention"], "--out", out], "--out", "png")
    expect_error(capsys, ["positions", "--out", out], "--out", "png")
    assert not (tmp_path / name).exists()


def test_other_picture_formats_are_written(run, tmp_path, capsys):
    out = tmp_path / "att.svg"
    assert main([*_commands(run)["attention"], "--out", str(out)]) == 0
    assert out.read_text().lstrip().startswith("<?xml")


def _lm(args: list[bytes], stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {**os.environ, "LC_ALL": "C.UTF-8", "PYTHONUTF8": "0"}
    return subprocess.run(
        [sys.executable.encode(), b"-m", b"lm", *args], input=stdin, capture_output=True, env=env
    )


def test_text_that_is_not_utf8_is_one_line(run, capsys, monkeypatch):
    r = os.fsencode(str(run))
    # Through a real command line once: argv's bytes as Python decodes them.
    out = _lm([b"sample", r, b"--prompt", b"ab\xffc"])
    assert out.returncode == 2, out.stderr
    assert out.stderr.count(b"\n") == 1 and b"Traceback" not in out.stderr, out.stderr
    assert b"--prompt" in out.stderr and b"UTF-8" in out.stderr, out.stderr
    # The others in this process: those bytes as the surrogates argv and stdin decode them to.
    cases = [
        ([b"sample", r, b"--prompt", b"-"], b"ab\xff\xfec", "standard input"),
        ([b"attention", r, b"--text", b"\xc3("], b"", "--text"),
        ([b"compare", r, b"--prompt", b"\xff", b"--eval-batches", b"1"], b"", "--prompt"),
    ]
    for argv, stdin, flag in cases:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
        expect_error(capsys, [os.fsdecode(a) for a in argv], flag, "UTF-8")


def test_prompt_from_standard_input_drops_one_final_newline(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("def f():\n\n"))
    assert _read_prompts(["-", "x"]) == ["def f():\n", "x"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("a\r\n"))
    assert _read_prompts(["-"]) == ["a"]


def test_standard_input_twice_is_refused(run, capsys):
    argv = ["sample", str(run), "--prompt", "-", "--prompt", "-"]
    expect_error(capsys, argv, "--prompt -", "once")


def test_scientific_notation_in_a_config_file_is_a_number(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    cfg.write_text(
        cfg.read_text().replace("lr: 0.003", "lr: 3e-3").replace("min_lr: 0.0003", "min_lr: 3E-4")
    )
    assert "3e-3" in cfg.read_text()
    config = load_config(cfg, ["train.weight_decay=1e-2"])
    assert config.train.lr == 3e-3 and config.train.min_lr == 3e-4
    assert config.train.weight_decay == 1e-2
    assert load_config(cfg, ["data.source=1e5x"]).data.source == "1e5x"


def test_messages_name_the_right_thing(run, tmp_path, capsys):
    (tmp_path / "cfgs").mkdir()
    expect_error(capsys, ["train", str(tmp_path / "cfgs")], "is a folder, not a config file")
    afile = tmp_path / "a.jsonl"
    afile.write_text('{"text": "a"}\n')
    expect_error(capsys, ["sample", str(afile), "--prompt", "x"], "is a file, not a run directory")


def test_a_checkpoint_can_be_named(run, capsys):
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert len(names) >= 2, names
    oldest, newest = names[0], names[-1]
    capsys.readouterr()

    def loss(*checkpoint: str) -> float:
        assert main(["eval", str(run), *checkpoint, "--max-batches", "1"]) == 0
        result = json.loads((run / "eval.json").read_text())
        assert Path(result["checkpoint"]).name == (checkpoint[1] if checkpoint else newest)
        return result["rows"][0]["loss"]

    assert loss("--checkpoint", oldest) != loss() == loss("--checkpoint", newest)

    def sampled(*checkpoint: str) -> str:
        sample = [*_commands(run)["sample"][:-1], "30"]  # long enough for the weights to show
        assert main([*sample, *checkpoint]) == 0
        return capsys.readouterr().out

    assert sampled("--checkpoint", oldest) != sampled() == sampled("--checkpoint", newest)
    expect_error(capsys, ["eval", str(run), "--checkpoint", "step_99999999"], "--checkpoint")


def test_a_damaged_newest_checkpoint_names_the_intact_older_one(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    names = sorted(p.name for p in (copy / "checkpoints").iterdir())
    newest = copy / "checkpoints" / names[-1] / "model.safetensors"
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0xFF
    newest.write_bytes(bytes(data))
    expect_error(capsys, ["eval", str(copy)], "damaged", names[-2], "--checkpoint")
    assert main(["eval", str(copy), "--checkpoint", names[-2], "--max-batches", "1"]) == 0


def _train(cfg, out, *more: str) -> int:
    return main(["train", str(cfg), "--out", str(out), *more])


def test_every_resume_is_recorded_and_config_yaml_keeps_how_the_run_began(tmp_path, capsys):
    cfg = write_config(
        tmp_path / "c.yaml",
        data={"cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 10, "eval_every": 100},
    )
    out = tmp_path / "run"
    assert _train(cfg, out, "--quiet") == 0
    assert _train(cfg, out, "--resume", "--set", "train.max_steps=20", "train.lr=1e-2") == 0
    err = capsys.readouterr().err
    assert re.search(r"done at step 20 in [\d.]+s; val_loss \d+\.\d{4}$", err.strip()), err
    assert _train(cfg, out, "--resume") == 0  # nothing left to train: no evaluation runs
    assert "no evaluation ran" in capsys.readouterr().err
    record = json.loads((out / "run.json").read_text())
    resumes = record["resumes"]
    assert [r["step"] for r in resumes] == [10, 20]
    assert resumes[0]["changed"] == {"train.max_steps": [10, 20], "train.lr": [0.003, 0.01]}
    assert resumes[1]["changed"] == {}  # against config.yaml: how the run began
    assert all(isinstance(r["argv"], list) for r in resumes)
    assert "git_commit" in record  # the provenance of the run's first command stays
    assert load_config(out / "config.yaml").train.max_steps == 10


def test_resume_falls_back_to_the_newest_intact_checkpoint(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    newest = sorted((copy / "checkpoints").iterdir())[-1]
    (newest / "model.safetensors").write_bytes(b"\0" * 64)
    cfg = copy / "config.yaml"
    assert _train(cfg, copy, "--resume") == 0
    err = capsys.readouterr().err
    assert f"{newest.name} is damaged" in err and "resuming from step_00000010" in err, err
    assert (copy / "checkpoints" / f"damaged-{newest.name}").is_dir()
    assert (newest / "model.safetensors").stat().st_size > 64  # trained again to that step


def test_compare_never_stitches_a_longer_run_onto_a_finished_one(tmp_path, capsys):
    cfg = write_config(
        tmp_path / "c.yaml",
        data={"cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 4, "eval_every": 4, "eval_steps": 1, "checkpoint_every": 4},
    )
    argv = ["compare", str(cfg), "--vary", "model.position=rope", "--out", str(tmp_path / "s")]
    argv += ["--quiet", "--eval-batches", "1", "--max-new-tokens", "2"]
    assert main(argv) == 0
    capsys.readouterr()
    expect_error(capsys, [*argv, "--set", "train.max_steps=8"], "train.max_steps", "--out")


def test_compare_vary_mistakes_blame_vary(tmp_path, capsys):
    cfg = write_config(tmp_path / "c.yaml")
    base = ["compare", str(cfg), "--out", str(tmp_path / "s")]
    expect_error(capsys, [*base, "--vary", "position=rope,alibi"], "--vary")
    argv = [*base, "--vary", "model.position=rope,alibi", "--vary", "model.n_layer=1,2"]
    expect_error(capsys, argv, "--vary", "one training key")
    assert not (tmp_path / "s").exists()


def test_report_only_compare_keeps_another_sweeps_report(run, tmp_path, monkeypatch, capsys):
    other = tmp_path / "runs" / "compare"
    other.mkdir(parents=True)
    report = {"compared": "position", "runs": [{"run_dir": str(tmp_path / "elsewhere")}]}
    (other / "report.json").write_text(json.dumps(report))
    second = tmp_path / "second"
    shutil.copytree(run, second)
    monkeypatch.chdir(tmp_path)
    expect_error(capsys, ["compare", str(run), str(second)], "report of other runs", "--out")
    assert json.loads((other / "report.json").read_text()) == report


def test_ctrl_c_in_compare_says_what_was_saved(tmp_path, capsys):
    from lm.training.loop import TrainResult

    cfg = write_config(tmp_path / "c.yaml")
    stopped = TrainResult(tmp_path, 6, "interrupted", None, None, 1.0)
    argv = ["compare", str(cfg), "--vary", "model.position=rope", "--out", str(tmp_path / "s")]
    with mock.patch("lm.training.loop.train", return_value=stopped):
        assert main([*argv, "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "checkpoint at step 6" in err and "resumes" in err, err


def test_version():
    out = subprocess.run([sys.executable, "-m", "lm", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().startswith("lm 0.")


def test_settings_that_do_not_apply_get_a_note(run, tmp_path, capsys):
    from lm.data.sources import ignored_settings

    cfg = load_config(None, ["data.tokenizer=char", "data.vocab_size=100", "data.split=test"])
    notes = ignored_settings(cfg.data)
    assert any("data.vocab_size" in n for n in notes) and any("data.split" in n for n in notes)
    assert (
        ignored_settings(load_config(None, ["data.source=org/some-hub-set", "data.split=x"]).data)
        == []
    )
    argv = [*_commands(run)["sample"], "--top-k", "3"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "lm: note: --top-k" in err and err.count("\n") == 1, err
    assert main([*argv, "--temperature", "1", "--seed", "0"]) == 0
    assert "note" not in capsys.readouterr().err
    assert main([*_commands(run)["sample"], "--no-kv-cache", "--compile"]) == 0
    err = capsys.readouterr().err
    assert "lm: note: --compile compiles the KV-cache step" in err and err.count("\n") == 1, err


def test_datasets_prints_no_progress_bars_of_its_own(tmp_path):
    corpus = tmp_path / "a.jsonl"
    corpus.write_text("".join(f'{{"text": "doc {i} " }}\n' for i in range(50)))
    cfg = write_config(
        tmp_path / "c.yaml",
        data={"source": str(corpus), "cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 1, "eval_every": 1, "eval_steps": 1},
    )
    out = subprocess.run(
        [sys.executable, "-m", "lm", "train", str(cfg), "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "lm: done at step 1" in out.stderr
    for theirs in ("Generating", "Map", "examples/s", "Saving the dataset"):
        assert theirs not in out.stderr, out.stderr


def test_training_warns_when_the_context_is_longer_than_the_validation_split(tmp_path, capsys):
    corpus = tmp_path / "a.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    cfg = write_config(
        tmp_path / "c.yaml",
        model={"context_length": 256},
        data={"source": str(corpus), "cache_dir": str(tmp_path / "cache"), "split_by": "file"},
        train={"max_steps": 1, "eval_every": 1, "eval_steps": 1, "batch_size": 2},
    )
    assert main(["train", str(cfg), "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "lm: warning: the validation split holds" in err and "model.context_length 256" in err
    assert (
        main(["train", str(cfg), "--out", str(tmp_path / "r2"), "--set", "model.context_length=16"])
        == 0
    )
    assert "warning" not in capsys.readouterr().err


def test_messages_point_the_right_way(run, tmp_path, capsys):
    """Each says what to change: the text, the tab, the micro-batch."""
    learned = untrained_run(tmp_path / "learned", position="learned")  # a table of 64 positions
    argv = ["attention", str(learned), "--text", "x" * 100]
    expect_error(capsys, argv, "--text: 100 tokens", "64 positions", "shorten --text")
    tabbed = tmp_path / "tab.yaml"
    tabbed.write_text("train:\n\tlr: 0.1\n")
    expect_error(capsys, ["train", str(tabbed)], "line 2, column 1", "a tab", "indent with spaces")
    cfg = write_config(tmp_path / "c.yaml", train={"batch_size": 8, "micro_batch_size": 16})
    expect_error(
        capsys,
        ["train", str(cfg), "--out", str(tmp_path / "r")],
        "train.micro_batch_size: 16",
        "more than train.batch_size 8",
    )


@pytest.mark.parametrize(
    ("vary", "says"),
    [
        ("model.position=rope,[rope,none", "does not close it"),
        ("model.position=rope,[rope,none],[rope, none]", "are the same setting"),
        ("model.rope_base=1e4,10000", "are the same setting"),
        ("model.position=rope,,alibi", "empty value"),
        ("model.position=rope,alibi,", "empty value"),
        ("data.source=data/a/t.txt,data/a_t.txt", "would both train in"),
    ],
)
def test_sweep_values_are_compared_as_settings_before_any_training(
    tmp_path, capsys, monkeypatch, vary, says
):
    (tmp_path / "data" / "a").mkdir(parents=True)
    for name in ("data/a/t.txt", "data/a_t.txt"):
        (tmp_path / name).write_text("some text to train on\n" * 50)
    cfg = write_config(tmp_path / "c.yaml")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "sweep"
    expect_error(capsys, ["compare", str(cfg), "--vary", vary, "--out", str(out)], "--vary", says)
    assert not out.exists()  # nothing trained, nothing recorded


def test_sweep_values_whose_extra_settings_differ_only_by_key_are_two_settings():
    from lm.compare.sweep import parse_vary

    vary = "model.position=none+model.bias=true,none+model.qk_norm=true"  # values none, true
    assert parse_vary(vary)[0] == "model.position"
    values = parse_vary(vary)[1]
    assert values == ["none+model.bias=true", "none+model.qk_norm=true"]


def test_a_joint_report_is_rebuilt_from_its_record(run, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(run, other)
    joint = tmp_path / "joint"
    assert main(["compare", str(run), str(other), "--out", str(joint), "--quiet"]) == 0
    first = (joint / "report.md").read_text()
    capsys.readouterr()
    assert main(["compare", str(joint), "--quiet"]) == 0  # its runs live elsewhere
    assert (joint / "report.md").read_text() == first


def test_a_damaged_metrics_log_is_read_past_its_cut_last_line_or_named(run, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    log = copy / "metrics.jsonl"
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"step": 21, "train_lo')  # what a kill mid-write leaves
    assert main(["compare", str(copy), "--quiet"]) == 0
    for damage in (b"not json\n", b"\xff\xfe\n"):
        log.write_bytes(damage + whole)
        expect_error(capsys, ["compare", str(copy), "--quiet"], "metrics.jsonl", "line 1")
