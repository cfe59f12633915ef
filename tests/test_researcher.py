"""A researcher's week with lm: the choices cache in every damaged, foreign, unwritable or
misplaced form, the Python API refusing what the command line refuses, and the sweeps, runs
continued from others and settings a researcher tries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from _support import assert_one_line, expect_error, tiny_config

import lm
from lm.cli import main
from lm.data.sources import cache_root
from lm.evaluate import evaluate_lengths
from lm.runtime import choices


def measure(ms=None):
    return lambda: dict(ms or MS)


MS = {"every": 10.0, "one": 20.0}
CONTEXT = {"model": {"d_model": 64}, "cores": 2}


def _kept(entry) -> None:
    """``choices.json`` holding ``entry`` under the key a timing of CONTEXT reads."""
    path = choices.cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({choices.key(CONTEXT): entry}))


GOOD = {"ms_per_step": {"every": 1.0, "one": 2.0}, "measured": "then"}


@pytest.mark.parametrize(
    "entry",
    [
        "fp32 sdpa",
        {**GOOD, "ms_per_step": [1, 2]},
        {**GOOD, "ms_per_step": {"every": "x", "one": 2.0}},
        {**GOOD, "ms_per_step": {"every": float("nan"), "one": 2.0}},
        {**GOOD, "measured": 5},
    ],
)
def test_a_damaged_entry_counts_as_absent_is_measured_again_and_listed_without_it(entry, capsys):
    _kept(entry)
    made = choices.timing(CONTEXT, measure(), cpus_used=2)
    assert (made.ms, made.how, made.not_kept) == (MS, "measured", "")
    assert choices.read()[choices.key(CONTEXT)]["ms_per_step"] == MS
    _kept(entry)
    assert main(["choices"]) == 0
    out = capsys.readouterr()
    assert "0 kept timing(s)" in out.err and "1 entry not of lm's: ignored" in out.err
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
    assert "0 kept timing(s)" in capsys.readouterr().err
    assert choices.timing(CONTEXT, measure(), cpus_used=2).how == "measured"
    assert len(choices.read()) == 1  # rewritten as lm's own


def test_lm_choices_rows_that_differ_only_in_position_or_window_say_how(capsys):
    for position, window in (("rope", None), ("alibi", None), ("rope", 8)):
        context = {"model": {"d_model": 64, "position": position, "window": window}, "cores": 2}
        choices.timing(context, measure(), cpus_used=2)
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
    assert "0 kept timing(s)" in capsys.readouterr().err
    expect_error(capsys, ["choices", "--clear"], "lm choices --clear: cannot remove")


def test_lm_choices_clear_of_a_read_only_cache_is_one_line(monkeypatch, capsys):
    choices.timing(CONTEXT, measure(), cpus_used=2)

    def refuse(self, missing_ok=False):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "unlink", refuse)  # chattr +i: refused even to root
    expect_error(capsys, ["choices", "--clear"], "cannot remove", "Operation not permitted")


@pytest.mark.parametrize("misplaced", ["under a file", "a folder"], indirect=True)
def test_a_cache_that_cannot_be_written_is_used_and_said_not_kept(misplaced, monkeypatch):
    import lm.compare.auto_jobs as sbs

    monkeypatch.setenv("LM_TUNE", "on")
    monkeypatch.setattr(sbs, "probe", lambda step, cores: dict(MS))
    made = sbs.auto_jobs(tiny_config(model={"vocab_size": 40}), torch.device("cpu"), 2, 4, 100)
    assert (made.how, made.ms) == ("measured", MS) and "could not be written" in made.not_kept


def test_a_read_only_cache_folder_is_recorded_as_not_kept(monkeypatch):
    def refuse(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(choices.os, "replace", refuse)  # chattr +i: refused even to root
    made = choices.timing(CONTEXT, measure(), cpus_used=2)
    assert made.how == "measured" and "Operation not permitted" in made.not_kept
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


def _train(root: Path, name: str, **sections) -> Path:
    """A tiny run of a few steps with a checkpoint at its end."""
    sections.setdefault("data", {})
    sections["data"] = {"cache_dir": str(root / "cache"), **sections["data"]}
    train_keys = {
        "max_steps": 2,
        "eval_every": 0,
        "checkpoint_every": 2,
        **sections.pop("train", {}),
    }
    lm.train(tiny_config(train=train_keys, **sections), root / name, quiet=True)
    return root / name


def test_xpos_beyond_its_reach_is_refused_not_nan(tmp_path):
    from lm.model.transformer import TransformerLM

    run = lm.load(_train(tmp_path, "xpos", model={"position": "xpos", "xpos_scale_base": 4}))
    losses = lm.loss_at(run, [256, 512], max_batches=1)  # 64 B = 256 positions
    assert losses[256] is not None and math.isfinite(losses[256])
    assert losses[512] is None
    rows = evaluate_lengths(run, run.run_dir, [512], "val", None, "cpu", 1)
    assert "computes positions up to 256 (64 B)" in rows[0]["note"]
    # The model itself refuses a pass beyond, and a config whose training reaches beyond.
    with pytest.raises(lm.config.LMError) as refused:
        run.model(torch.zeros(1, 300, dtype=torch.long))
    assert_one_line(refused, "model.xpos_scale_base: 4", "up to position 256", "reaches 299")
    small = tiny_config(model={"position": "xpos", "xpos_scale_base": 0.25, "vocab_size": 10})
    with pytest.raises(lm.config.LMError) as refused:
        TransformerLM(small.model)
    assert_one_line(refused, "model.xpos_scale_base: 0.25", "up to position 16", "reads 32")


def test_a_cope_run_continues_at_a_longer_context(tmp_path):
    source = _train(tmp_path, "cope", model={"position": "cope"})
    longer = {"context_length": 64, "position": "cope"}
    for name, model in (("a", longer), ("b", {**longer, "cope_max": 33})):
        config = tiny_config(
            model=model,
            data={"cache_dir": str(tmp_path / "cache")},
            train={"max_steps": 2, "eval_every": 0},
        )
        result = lm.train(config, tmp_path / name, init_from=source, quiet=True)
        assert result.status == "done"
        assert lm.load(tmp_path / name).config.model.cope_max == 33  # its table, as it ran
    with pytest.raises(lm.config.LMError) as refused:
        config = tiny_config(model={**longer, "cope_max": 40}, data={"cache_dir": str(tmp_path)})
        lm.train(config, tmp_path / "c", init_from=source, quiet=True)
    assert_one_line(refused, "model.cope_max is 33 there and 40 here")


def test_init_from_compares_only_the_keys_its_schemes_read_and_names_them(tmp_path):
    source = _train(tmp_path, "fox", model={"position": "fox"})
    cache = {"cache_dir": str(tmp_path / "cache")}
    fire = tiny_config(model={"position": "fox", "fire_threshold": 4}, data=cache)
    fire = fire.replace(train=tiny_config(train={"max_steps": 1, "eval_every": 0}).train)
    assert lm.train(fire, tmp_path / "a", init_from=source, quiet=True).status == "done"
    ssmax = tiny_config(model={"position": "fox", "normalize": "ssmax"}, data=cache)
    with pytest.raises(lm.config.LMError) as refused:
        lm.train(ssmax, tmp_path / "b", init_from=source, quiet=True)
    assert_one_line(refused, "model.normalize is 'softmax' there and 'ssmax' here")


def test_init_from_another_tasks_run_whose_symbols_it_does_not_know_is_refused(tmp_path):
    task = {"tokenizer": "char", "mode": "padded", "task_examples": 64, "task_eval_examples": 8}
    flipflop = {**task, "source": "builtin:flipflop", "task_lengths": 4, "task_eval_lengths": 4}
    source = _train(tmp_path, "ff", data=flipflop)
    copy = {**task, "source": "builtin:copy", "task_lengths": "1-8", "task_eval_lengths": "1-8"}
    config = tiny_config(data={**copy, "cache_dir": str(tmp_path / "cache")})
    with pytest.raises(lm.config.LMError) as refused:
        lm.train(config, tmp_path / "copy", init_from=source, quiet=True)
    assert_one_line(refused, "of the training split's characters are not in the vocabulary")
    assert not (tmp_path / "copy" / "checkpoints").exists()


@pytest.mark.parametrize(
    ("position", "refused"),
    [("none", True), ("fox", True), ("cope", True), ("[fox, none]", True), ("rope", False)],
)
def test_random_positions_is_refused_for_every_scheme_that_reads_none(position, refused):
    from lm.config.load import load_config

    overrides = [f"model.position={position}", "model.random_positions=512", "model.n_layer=2"]
    if refused:
        with pytest.raises(lm.config.LMError) as error:
            load_config(Path("configs/default.yaml"), overrides)
        assert_one_line(error, "model.random_positions: position:", "reads no positions")
    else:
        assert load_config(Path("configs/default.yaml"), overrides).model.random_positions == 512


def test_eval_rope_scaling_applies_to_xpos_as_its_config_key_does(tmp_path, capsys):
    run = _train(tmp_path, "xpos", model={"position": "xpos"})
    for scaling in ("none", "pi:2"):
        assert main(["eval", str(run), "--rope-scaling", scaling, "--max-batches", "1"]) == 0
    assert "loss" in capsys.readouterr().out


def test_export_takes_a_window_list_that_reads_every_key(tmp_path):
    run = _train(tmp_path, "w", model={"window": [None, None]})
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").is_file()


def test_a_second_sweep_into_one_out_is_refused_and_no_run_counts_twice(tmp_path, capsys):
    import shutil

    from _support import write_config

    cfg = write_config(
        tmp_path / "c.yaml",
        data={"cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 2, "eval_every": 0, "checkpoint_every": 2, "seed": 1},
    )
    out = tmp_path / "s"
    flags = ["--out", str(out), "--quiet", "--eval-batches", "1", "--max-new-tokens", "2"]
    assert main(["compare", str(cfg), "--vary", "model.position=rope,none", *flags]) == 0
    capsys.readouterr()
    second = ["compare", str(cfg), "--vary", "model.normalize=softmax,ssmax", *flags]
    expect_error(capsys, second, f"--out {out}: holds a sweep of position", "another --out")
    assert not (out / "normalize=softmax").exists()
    # The same sweep again (more values of its key) is one sweep, its runs reused.
    assert main(["compare", str(cfg), "--vary", "model.position=rope,none,alibi", *flags]) == 0
    # A folder that holds one config's run twice (copied by hand) counts it once.
    shutil.copytree(out / "position=rope" / "seed1", out / "position=rope_again" / "seed1")
    capsys.readouterr()
    assert main(["compare", str(out), "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert len(report["runs"]) == 3
    assert "2 seeds" not in (out / "report.md").read_text()


def test_more_jobs_than_runs_says_how_many_run(tmp_path, capsys):
    from _support import write_config

    cfg = write_config(
        tmp_path / "c.yaml",
        data={"cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 2, "eval_every": 0, "checkpoint_every": 2},
    )
    argv = ["compare", str(cfg), "--vary", "model.position=rope,none", "--jobs", "5"]
    assert main([*argv, "--out", str(tmp_path / "s"), "--eval-batches", "1"]) == 0
    err = capsys.readouterr().err
    assert "of 2 jobs running" in err and "of 5 jobs" not in err


MEASURED = {
    "final_val_loss": 2.0,
    "best_val_loss": 1.9,
    "tokens_per_s": 1000.0,
    "wall_s": 30.0,
    "extrapolation": [2.0, 2.5, 3.0],
}


def test_a_report_of_two_tasks_says_why_one_has_no_cell_under_the_others_columns():
    import dataclasses

    from test_report import result

    from lm.compare.report import render

    task = {"tokenizer": "char", "mode": "padded", "task_lengths": 4, "task_eval_lengths": 4}
    row = {"length": 4, "accuracy": 0.5, "correct": 5, "examples": 10, "trained": True}
    splits = [{**row, "split": s} for s in ("dense", "sparse")]
    runs = [
        dataclasses.replace(
            result("rope", seed, run_dir=Path(f"s/{seed}"), **MEASURED),
            config=tiny_config(data={**task, "source": source}),
            accuracy=rows,
        )
        for seed, source, rows in ((1, "builtin:flipflop", splits), (2, "builtin:copy", [row]))
    ]
    markdown, _ = render(runs, "w1", 4)
    assert "n/a" in markdown
    assert "The runs are of 2 tasks (builtin:flipflop, builtin:copy)" in markdown
