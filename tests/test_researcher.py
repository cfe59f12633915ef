"""A researcher's week with lm: the choices cache in every damaged, foreign, unwritable or
misplaced form, the Python API refusing what the command line refuses, and the sweeps, runs
continued from others and settings a researcher tries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _support import expect_error, tiny_config

import lm.training.tune as tune
from lm.cli import main
from lm.data.sources import cache_root
from lm.runtime import choices
from lm.training.loop import train


def fake_steps(seconds: dict[str, float]):
    return {name: (lambda s=s: s) for name, s in seconds.items()}


STEPS = {"fp32": 0.01, "bf16": 0.02}
CONTEXT = {"model": {"d_model": 64}, "threads": 1}


def _kept(entry) -> None:
    """``choices.json`` holding ``entry`` under the key a dtype choice of CONTEXT reads."""
    path = choices.cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({choices.key("train.dtype", CONTEXT): entry}))


GOOD = {"value": "fp32", "ms_per_step": {"fp32": 1.0, "bf16": 2.0}, "measured": "then"}


@pytest.mark.parametrize(
    "entry",
    [
        "fp32 sdpa",
        {**GOOD, "value": ["fp32 sdpa"]},
        {**GOOD, "ms_per_step": [1, 2]},
        {**GOOD, "ms_per_step": {"fp32 sdpa": "x"}},
        {**GOOD, "ms_per_step": {"fp32": float("nan")}},
        {**GOOD, "measured": 5},
    ],
)
def test_a_damaged_entry_counts_as_absent_is_measured_again_and_listed_without_it(entry, capsys):
    _kept(entry)
    made = choices.choose("train.dtype", CONTEXT, fake_steps(STEPS), tune._prefer)
    assert (made.value, made.how, made.not_kept) == ("fp32", "measured", "")
    assert choices.read()[choices.key("train.dtype", CONTEXT)]["ms_per_step"] == {
        "fp32": 10.0,
        "bf16": 20.0,
    }
    _kept(entry)
    assert main(["choices"]) == 0
    out = capsys.readouterr()
    assert "0 measured choice(s)" in out.err and "1 entry not of lm's: ignored" in out.err
    assert out.out == ""


@pytest.mark.parametrize(
    "text",
    [
        '{"version": 99, "choices": {}}',
        '{"1": {}}',
        '{"{\\"kind\\": 3}": {"value": "x"}}',
        "[1, 2]",
        '"just text"',
        "\xff not json",
    ],
)
def test_a_foreign_cache_file_is_listed_as_empty_never_a_traceback(text, capsys):
    choices.cache_file().parent.mkdir(parents=True, exist_ok=True)
    choices.cache_file().write_text(text, encoding="latin-1")
    assert main(["choices"]) == 0
    assert "0 measured choice(s)" in capsys.readouterr().err
    steps = fake_steps(STEPS)
    assert choices.choose("train.dtype", CONTEXT, steps, tune._prefer).how == "measured"
    assert len(choices.read()) == 1  # rewritten as lm's own


def test_lm_choices_rows_that_differ_only_in_position_or_window_say_how(capsys):
    for position, window in (("rope", None), ("alibi", None), ("rope", 8)):
        context = {"model": {"d_model": 64, "position": position, "window": window}, "threads": 1}
        choices.choose("train.dtype", context, fake_steps(STEPS), tune._prefer)
    assert main(["choices"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 3 and len(set(rows)) == 3
    assert "position=alibi window=null" in rows[1] and "position=rope window=8" in rows[2]


@pytest.fixture
def misplaced(tmp_path, monkeypatch, request):
    """The cache's folder is a file, or its file a folder: nothing can be written there."""
    where = tmp_path / "cache"
    if request.param == "under a file":
        where.write_text("a file")
    else:
        (where / choices.FILE).mkdir(parents=True)
    monkeypatch.setenv("LM_CACHE", str(where))
    return request.param


@pytest.mark.parametrize("misplaced", ["under a file", "a folder"], indirect=True)
def test_lm_choices_clear_of_a_misplaced_cache_is_one_line(misplaced, capsys):
    assert main(["choices"]) == 0  # nothing kept there: an empty list
    assert "0 measured choice(s)" in capsys.readouterr().err
    expect_error(capsys, ["choices", "--clear"], "lm choices --clear: cannot remove")


def test_lm_choices_clear_of_a_read_only_cache_is_one_line(monkeypatch, capsys):
    steps = fake_steps(STEPS)
    choices.choose("train.dtype", CONTEXT, steps, tune._prefer)

    def refuse(self, missing_ok=False):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "unlink", refuse)  # chattr +i: refused even to root
    expect_error(capsys, ["choices", "--clear"], "cannot remove", "Operation not permitted")


@pytest.mark.parametrize("misplaced", ["under a file", "a folder"], indirect=True)
def test_a_cache_that_cannot_be_written_is_recorded_as_not_kept(
    misplaced, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("LM_TUNE", "on")
    monkeypatch.setattr(tune, "cpu_bf16_kind", lambda: "avx512_bf16")
    config = tiny_config(
        model={"kernel": "sdpa"},
        data={"cache_dir": str(tmp_path / "data")},
        train={"dtype": "auto", "max_steps": 2, "eval_every": 0},
    )
    train(config, tmp_path / "run")
    record = json.loads((tmp_path / "run" / "run.json").read_text())["ran"]["dtype_choice"]
    assert record["how"] == "measured" and "cache" not in record
    assert "could not be written" in record["not_kept"]
    err = capsys.readouterr().err
    assert "measured now (" in err and "not kept: " in err and "kept in" not in err
    assert "the next run measures again" in err


def test_a_read_only_cache_folder_is_recorded_as_not_kept(monkeypatch):
    def refuse(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(choices.os, "replace", refuse)  # chattr +i: refused even to root
    made = choices.choose("train.dtype", CONTEXT, fake_steps(STEPS), tune._prefer)
    assert made.how == "measured" and "Operation not permitted" in made.not_kept
    assert "cache" not in made.record() and made.record()["not_kept"] == made.not_kept
    assert not list(choices.cache_file().parent.iterdir())  # no temporary file left behind


def test_the_cache_follows_xdg_cache_home_and_lm_cache_comes_first(tmp_path, monkeypatch):
    monkeypatch.delenv("LM_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert choices.cache_file() == tmp_path / "xdg" / "lm" / "choices.json"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the spec: ignored unless absolute
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert choices.cache_file() == tmp_path / "home" / ".cache" / "lm" / "choices.json"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("LM_CACHE", str(tmp_path / "mine"))
    assert choices.cache_file() == tmp_path / "mine" / "choices.json"
    monkeypatch.delenv("LM_CACHE")
    assert cache_root(tiny_config().data) == tmp_path / "xdg" / "lm"  # tokenized data too
