"""A researcher's week with lm: the choices cache in every damaged, foreign, unwritable or
misplaced form, the Python API refusing what the command line refuses, and the sweeps, runs
continued from others and settings a researcher tries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _support import assert_one_line, expect_error, tiny_config

import lm
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


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One tiny trained run, for the Python API's refusals."""
    root = tmp_path_factory.mktemp("api")
    config = tiny_config(
        train={"max_steps": 4, "eval_every": 0, "checkpoint_every": 4},
        data={"cache_dir": str(root / "cache")},
    )
    lm.train(config, root / "run", quiet=True)
    return root / "run"


def test_loss_at_reads_the_split_it_is_given_and_refuses_others(run_dir):
    run = lm.load(run_dir, device="cpu")
    val, train_split = (lm.loss_at(run, ["1x"], split=s, max_batches=2) for s in ("val", "train"))
    assert val != train_split  # each its own split
    for split in ("test", "validation", "Train"):
        with pytest.raises(lm.config.LMError) as refused:
            lm.loss_at(run, ["1x"], split=split)
        assert_one_line(refused, f"split: {split!r} is not one of val, train")


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda run: lm.generate(run, "The", max_new_tokens=-1), ["max_new_tokens", "at least 1"]),
        (lambda run: lm.generate(run, "The", max_new_tokens=2.5), ["max_new_tokens", "integer"]),
        (lambda run: lm.generate(run, "The", top_k=0), ["top_k: 0 must be at least 1"]),
        (lambda run: lm.generate(run, "The", temperature=float("nan")), ["temperature", "finite"]),
        (lambda run: lm.generate(run, "The", temperature=-1), ["temperature: -1 must be"]),
        (lambda run: lm.generate(run, []), ["prompts: none given"]),
        (lambda run: lm.generate(run, [b"The"]), ["prompts: b'The' is not text"]),
        (lambda run: lm.generate(run, "\udcff"), ["prompts: not valid UTF-8"]),
        (lambda run: lm.generate(42, "The"), ["run: int is not a run"]),
        (lambda run: lm.loss_at(run, "2x,0"), ["lengths: '0': a length in tokens must be at"]),
        (lambda run: lm.loss_at(run, [100.5]), ["lengths: 100.5 is not a length"]),
        (lambda run: lm.loss_at(run, [0]), ["lengths: '0': a length in tokens must be at least 2"]),
        (lambda run: lm.loss_at(run, []), ["lengths: '': no lengths given"]),
        (lambda run: lm.loss_at(run, max_batches=0), ["max_batches: 0 must be at least 1"]),
        (lambda run: lm.loss_at(run, batch_size=-2), ["batch_size: -2 must be at least 1"]),
        (lambda run: lm.rope(torch.ones(4, 2, dtype=torch.long), torch.arange(4)), ["rope: x"]),
    ],
)
def test_the_api_refuses_what_the_command_line_refuses_in_its_words(run_dir, call, words):
    run = lm.load(run_dir, device="cpu")
    with pytest.raises(lm.config.LMError) as refused:
        call(run)
    assert_one_line(refused, *words)


def test_the_api_and_the_command_line_share_their_messages(run_dir, capsys):
    run = lm.load(run_dir, device="cpu")
    for flag, value, arg in (
        ("--max-new-tokens", "-1", "max_new_tokens"),
        ("--top-k", "0", "top_k"),
    ):
        err = expect_error(capsys, ["sample", str(run_dir), "--prompt", "a", flag, value], flag)
        with pytest.raises(lm.config.LMError) as api:
            lm.generate(run, "a", **{arg: int(value)})
        assert err.split(f"{flag}: ")[1].split(" (see")[0].replace(f"'{value}'", value) == str(
            api.value
        ).removeprefix(f"{arg}: ")
    err = expect_error(capsys, ["eval", str(run_dir), "--context-lengths", "0"], "at least 2")
    with pytest.raises(lm.config.LMError) as api:
        lm.loss_at(run, [0])
    assert str(api.value).removeprefix("lengths: ") in err


def test_the_api_takes_a_run_directory_where_a_run_is_expected(run_dir):
    run = lm.load(run_dir, device="cpu")
    assert lm.generate(str(run_dir), "The", max_new_tokens=3) == lm.generate(
        run, "The", max_new_tokens=3
    )
    assert lm.loss_at(run_dir, "1x", max_batches=1) == lm.loss_at(run, ["1x"], max_batches=1)
    assert lm.loss_at(run, 16, max_batches=1).keys() == {16}  # one length, in tokens


def test_train_refuses_resume_with_overwrite_and_keeps_the_run(run_dir, tmp_path):
    before = (run_dir / "run.json").read_text()
    config = run_dir / "config.yaml"
    with pytest.raises(lm.config.LMError) as refused:
        lm.train(config, run_dir, resume=True, overwrite=True)
    assert_one_line(refused, "resume and overwrite: give one")
    assert (run_dir / "run.json").read_text() == before


def test_attention_mask_has_the_documented_shape_with_or_without_causal():
    key_mask = torch.tensor([[False, True, True], [True, True, True]])
    for causal in (True, False):
        assert lm.attention_mask(key_mask, causal=causal).shape == (2, 1, 3, 3)
    assert lm.attention_mask(key_mask, causal=False)[0, 0].tolist() == [[False, True, True]] * 3
