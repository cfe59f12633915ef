"""The passkey task (lm/data/tasks.py, lm/evaluate.py): its format, its seeding, PI's k_max, the
grid lm eval prints and keeps, the compare report's heatmaps, and its bad settings refused."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
from _support import assert_one_line, assert_same_weights, expect_error, losses, write_config

from lm.cli import main
from lm.compare.passkey import passkey_section
from lm.compare.report import _mean_std
from lm.config.errors import ConfigError
from lm.config.load import load_config, save_config
from lm.config.names import task_tokens
from lm.config.tasks import PASSKEY_SHORTEST
from lm.data.tasks import (
    PASSKEY_FILLER,
    PASSKEY_KEY,
    PASSKEY_QUESTION,
    TaskSettings,
    alphabet,
    evaluation_examples,
    example,
    training_examples,
)
from lm.evaluate import k_max

CYCLE = "".join(PASSKEY_FILLER)


def parts(prompt: str, answer: str) -> tuple[str, str, str]:
    """The filler before the key sentence, the key sentence, the filler after it."""
    sentence = PASSKEY_KEY.format(key=answer)
    assert prompt.count(sentence) == 1 and prompt.endswith(PASSKEY_QUESTION)
    before, after = prompt.removesuffix(PASSKEY_QUESTION).split(sentence)
    return before, sentence, after


@pytest.mark.parametrize("length", [PASSKEY_SHORTEST, 51, 128, 700])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 1.0])
def test_a_passkey_example_hides_its_key_at_its_depth_and_is_exactly_its_length(length, depth):
    rng = np.random.default_rng(3)
    for _ in range(20):
        prompt, answer = example("passkey", length, rng, TaskSettings(depth=depth))
        assert len(prompt + answer) == length and len(prompt + answer) + 1 == task_tokens(
            "passkey", length
        )
        assert len(answer) == 5 and 10000 <= int(answer) <= 99999
        before, _, after = parts(prompt, answer)
        filler = length - PASSKEY_SHORTEST
        assert len(before) == round(depth * filler) and len(before) + len(after) == filler
        # The filler is one window of the sentences repeated, the key after a whole sentence.
        assert (before + after) in CYCLE * (length // len(CYCLE) + 2)
        if len(before) >= 2:
            assert before.endswith(". ")
        if after:  # a new sentence follows the key sentence (or the question does)
            assert any(sentence.startswith(after[:2]) for sentence in PASSKEY_FILLER)
        assert set(prompt + answer) <= set(alphabet("passkey", TaskSettings()))


def test_the_shortest_passkey_length_the_config_checks_is_what_the_generator_writes():
    prompt, answer = example("passkey", PASSKEY_SHORTEST, np.random.default_rng(0), TaskSettings())
    assert prompt == PASSKEY_KEY.format(key=answer) + PASSKEY_QUESTION
    with pytest.raises(ValueError, match="needs 50 characters"):
        example("passkey", PASSKEY_SHORTEST - 1, np.random.default_rng(0), TaskSettings())


def test_training_draws_the_depth_uniformly_and_every_draw_comes_from_the_seed():
    drawn = training_examples("passkey", range(128, 129), 2000, seed=5)
    depths = [len(parts(p, a)[0]) for p, a in drawn]
    filler = 128 - PASSKEY_SHORTEST
    assert min(depths) == 0 and max(depths) == filler  # both ends reached
    assert abs(np.mean(depths) - filler / 2) < 3  # uniform: its mean is the middle
    assert len({a for _, a in drawn}) > 1900  # keys drawn afresh for each example
    assert drawn == training_examples("passkey", range(128, 129), 2000, seed=5)
    assert drawn != training_examples("passkey", range(128, 129), 2000, seed=6)
    half = TaskSettings(depth=0.5)
    cell = evaluation_examples("passkey", 256, 10, 5, half, 2)
    assert cell == evaluation_examples("passkey", 256, 10, 5, half, 2)
    assert cell != evaluation_examples("passkey", 256, 10, 5, half, 3)  # each depth its own keys
    assert cell != evaluation_examples("passkey", 256, 10, 6, half, 2)


def rows(*accuracies: float | None) -> list[dict]:
    return [{"length": 64 * (i + 1), "accuracy": a} for i, a in enumerate(accuracies)]


@pytest.mark.parametrize(
    ("grid", "expected"),
    [
        (rows(1.0, 0.9, 0.5, 0.2), 256),  # 20% still counts
        (rows(0.1, 1.0, 1.0), None),  # the first length fails: no k_max
        (rows(1.0, 0.6, 0.1, 0.9, 1.0), 128),  # a dip, then a rise: the rise does not count
        (rows(1.0, None, 1.0), 64),  # out of the model's reach: it ends there
        (rows(0.19999), None),
    ],
)
def test_k_max_is_the_longest_length_every_shorter_one_retrieves_at_20_percent(grid, expected):
    assert k_max(grid) == expected
    assert k_max(list(reversed(grid))) == expected  # read shortest first, whatever the order


def test_passkey_trains_at_the_context_and_the_run_records_that_length(tmp_path):
    config = load_config(None, ["data.source=builtin:passkey", "model.context_length=96"])
    assert config.data.task_lengths == 96 and config.data.task_ranges()[0] == range(96, 97)
    save_config(config, tmp_path / "config.yaml")  # a run's config.yaml says what was trained
    assert load_config(tmp_path / "config.yaml") == config
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "config.yaml", ["model.context_length=128"])
    assert_one_line(e, "data.task_lengths: 96; builtin:passkey trains up to the context")


def test_passkey_trains_on_a_range_of_lengths_each_drawn_from_the_seed(tmp_path):
    # PI fine-tunes on text holding every distance up to its new window, not one length.
    ranged = ["data.source=builtin:passkey", "model.context_length=128", "data.task_lengths=64-128"]
    config = load_config(None, ranged)
    lengths = config.data.task_ranges()[0]
    assert lengths == range(64, 129)
    drawn = training_examples("passkey", lengths, 3000, seed=5)
    sizes = [len(p) + len(a) for p, a in drawn]
    assert set(sizes) == set(lengths)  # every length of the range, none outside it
    assert abs(np.mean(sizes) - 96) < 2  # uniformly: its mean is the middle
    assert drawn == training_examples("passkey", lengths, 3000, seed=5)
    assert drawn != training_examples("passkey", lengths, 3000, seed=6)
    save_config(config, tmp_path / "config.yaml")  # the run's record keeps the range
    assert load_config(tmp_path / "config.yaml").data.task_lengths == "64-128"
    with pytest.raises(ConfigError) as e:  # a longer context later is not trained short
        load_config(tmp_path / "config.yaml", ["model.context_length=256"])
    assert_one_line(e, "data.task_lengths: '64-128'; builtin:passkey trains up to the context")


def test_a_passkey_run_on_a_range_resumes_exactly_and_its_grid_marks_every_trained_length(
    tmp_path, capsys
):
    data = {**TINY_PASSKEY, "task_lengths": "64-96", "passkey_lengths": "64,80,96,128"}
    data["cache_dir"] = str(tmp_path / "cache")
    model = {"context_length": 96}
    train = {"max_steps": 6, "eval_every": 3, "checkpoint_every": 3, "log_every": 1}
    whole = write_config(tmp_path / "whole.yaml", model=model, data=data, train=train)
    cut = write_config(
        tmp_path / "cut.yaml", model=model, data=data, train={**train, "max_steps": 3}
    )
    assert main(["train", str(whole), "--out", str(tmp_path / "whole"), "--quiet"]) == 0
    assert main(["train", str(cut), "--out", str(tmp_path / "cut"), "--quiet"]) == 0
    argv = ["train", str(whole), "--out", str(tmp_path / "cut"), "--resume", "--quiet"]
    assert main(argv) == 0
    assert (
        losses(tmp_path / "cut") == losses(tmp_path / "whole")
        and len(losses(tmp_path / "cut")) == 6
    )
    assert losses(tmp_path / "cut", "val_loss") == losses(tmp_path / "whole", "val_loss")
    assert_same_weights(tmp_path / "cut", tmp_path / "whole")
    assert main(["eval", str(tmp_path / "whole")]) == 0
    grid = json.loads((tmp_path / "whole" / "eval.json").read_text())["accuracy"]
    assert [(r["length"], r["trained"]) for r in grid] == [
        (64, True),
        (80, True),
        (96, True),
        (128, False),
    ]


FITS = ["data.source=builtin:passkey", "model.context_length=64"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            ["data.source=builtin:passkey", "model.context_length=40"],
            "model.context_length: 40 with builtin:passkey, which trains at the context; the key "
            "sentence, the question and the answer take 50 characters: at least 50",
        ),
        ([*FITS, "data.task_lengths=40-64"], "trains builtin:passkey at 40 characters"),
        (
            [*FITS, "data.task_lengths=50-128"],
            "'50-128'; builtin:passkey trains up to the context, model.context_length=64",
        ),
        ([*FITS, "data.task_lengths=56"], "data.task_lengths: 56; builtin:passkey trains up to"),
        ([*FITS, "data.task_lengths=64-5x"], "'64-5x' is not a range of lengths"),
        ([*FITS, "data.task_eval_lengths=1-80"], "builtin:passkey is measured at data.passkey_l"),
        ([*FITS, "data.passkey_depths=1"], "data.passkey_depths: 1; at least 2"),
        ([*FITS, "data.passkey_lengths=0.5x,2x"], "asks at 32 characters"),
        ([*FITS, "data.passkey_lengths=2y"], "data.passkey_lengths: '2y' is not a comma-separated"),
        ([*FITS, "data.tokenizer=bpe", "data.vocab_size=300"], "lengths are characters"),
        (
            ["data.source=builtin:copy", "data.passkey_depths=3"],
            "applies to data.source: builtin:p",
        ),
    ],
)
def test_bad_passkey_settings_are_one_line_and_exit_2(settings, message, tmp_path, capsys):
    config = write_config(tmp_path / "c.yaml", data={"cache_dir": str(tmp_path / "cache")})
    with pytest.raises(ConfigError) as e:
        load_config(config, settings)
    assert_one_line(e, message)
    argv = ["train", str(config), "--out", str(tmp_path / "run"), "--set", *settings]
    expect_error(capsys, argv, message)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


TINY_PASSKEY = {
    "source": "builtin:passkey",
    "mode": "padded",
    "task_examples": 60,
    "task_eval_examples": 3,
    "passkey_lengths": "1x,2x,200",
    "passkey_depths": 3,
}


def test_lm_eval_prints_the_grid_and_k_max_and_keeps_them_the_same_twice(tmp_path, capsys):
    config = write_config(
        tmp_path / "pk.yaml",
        model={"context_length": 64},
        data={**TINY_PASSKEY, "cache_dir": str(tmp_path / "cache")},
        train={"max_steps": 3, "eval_every": 0, "checkpoint_every": 3},
    )
    run = tmp_path / "run"
    assert main(["train", str(config), "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "| length | depth 0% | depth 50% | depth 100% | mean | trained |" in printed
    for length in (64, 128, 200):
        assert f"\n| {length} | " in printed
    saved = json.loads((run / "eval.json").read_text())
    grid = saved["accuracy"]
    assert [r["length"] for r in grid] == [64, 128, 200]
    assert [r["trained"] for r in grid] == [True, False, False]
    for row in grid:
        assert [c["depth"] for c in row["depths"]] == [0.0, 0.5, 1.0]
        assert all(c["examples"] == 3 and 0 <= c["correct"] <= 3 for c in row["depths"])
        assert row["correct"] == sum(c["correct"] for c in row["depths"])
        assert row["accuracy"] == pytest.approx(np.mean([c["accuracy"] for c in row["depths"]]))
    assert saved["k_max"] == k_max(grid)
    found = "none" if saved["k_max"] is None else saved["k_max"]
    assert f"k_max: {found} (the longest length" in printed
    # An evaluation is a function of the run: the same numbers again.
    assert main(["eval", str(run)]) == 0
    assert json.loads((run / "eval.json").read_text())["accuracy"] == grid


def test_a_passkey_compare_draws_a_heatmap_per_run_and_reports_k_max(tmp_path, capsys):
    config = write_config(
        tmp_path / "pk.yaml",
        model={"context_length": 64},
        data={**TINY_PASSKEY, "passkey_lengths": "1x,2x"},
        train={"max_steps": 2, "eval_every": 0, "checkpoint_every": 2},
    )
    out = tmp_path / "sweep"
    argv = ["compare", str(config), "--vary", "model.position=rope,learned", "--seeds", "1"]
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    assert main([*argv, "--set", cache, "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert (out / "passkey_grid.png").stat().st_size > 0
    markdown = (out / "report.md").read_text()
    assert "## Passkey retrieval by length and depth" in markdown
    assert "| position | seed | k_max | @64 | @128 |" in markdown
    assert "![passkey accuracy by length and depth](passkey_grid.png)" in markdown
    runs = {r["label"]: r for r in json.loads((out / "report.json").read_text())["runs"]}
    for run in runs.values():
        assert [row["length"] for row in run["accuracy"]] == [64, 128]
        assert all(len(row["depths"]) == 3 for row in run["accuracy"])
        assert run["k_max"] == k_max(run["accuracy"])
    # A learned table has no row past the context: that cell is not measured, and says why.
    past = runs["learned"]["accuracy"][1]
    assert past["accuracy"] is None and "learned positions stop at 64" in past["note"]
    assert runs["learned"]["k_max"] in (None, 64)
    assert "| learned | 1 |" in markdown and markdown.count("n/a") >= 1


def _grid(*accuracies: float) -> list[dict]:
    """Passkey rows at 64, 128, ... with these accuracies (one depth each)."""
    return [
        {"length": 64 * (i + 1), "accuracy": a, "depths": [{"depth": 0.0, "examples": 10}]}
        for i, a in enumerate(accuracies)
    ]


def test_the_report_gives_each_group_k_max_and_accuracy_as_mean_and_spread_over_seeds():
    runs = [
        types.SimpleNamespace(seed=1, accuracy=_grid(1.0, 0.6)),
        types.SimpleNamespace(seed=2, accuracy=_grid(1.0, 0.4)),
        types.SimpleNamespace(seed=1, accuracy=_grid(1.0, 0.1)),
        types.SimpleNamespace(seed=2, accuracy=_grid(0.1, 0.0)),
    ]
    labels = ["pi:4", "pi:4", "none", "none"]
    lines = passkey_section(runs, "rope_scaling", labels, _mean_std)
    assert "| rope_scaling | seeds | k_max | @64 | @128 |" in lines
    assert "| pi:4 | 2 | 128 | 100.0% | 50.0% ± 14.1% |" in lines
    # A seed with no k_max has no mean: each seed's is shown.
    assert "| none | 2 | 64, none | 55.0% ± 63.6% | 5.0% ± 7.1% |" in lines
    assert "| none | 2 | none | 10.0% | 0.0% |" in lines  # then each run's row


def test_a_passkey_run_fine_tunes_at_a_longer_context_from_another(tmp_path):
    # The passkey task counts characters, so its tokenizer must stay char or byte: the run's
    # own name is kept (the same task and kind make the same ids), not the source's file.
    data = {**TINY_PASSKEY, "cache_dir": str(tmp_path / "cache")}
    train = {"max_steps": 2, "eval_every": 0, "checkpoint_every": 2}
    base = write_config(tmp_path / "pk.yaml", model={"context_length": 64}, data=data, train=train)
    assert main(["train", str(base), "--out", str(tmp_path / "base"), "--quiet"]) == 0
    longer = {"context_length": 128, "rope_scaling": "pi:2"}
    tune = write_config(tmp_path / "tune.yaml", model=longer, data=data, train=train)
    argv = ["train", str(tune), "--out", str(tmp_path / "tuned"), "--quiet"]
    assert main([*argv, "--init-from", str(tmp_path / "base")]) == 0
    assert (tmp_path / "tuned" / "tokenizer.json").read_bytes() == (
        tmp_path / "base" / "tokenizer.json"
    ).read_bytes()
    record = json.loads((tmp_path / "tuned" / "run.json").read_text())
    assert record["init_from"]["step"] == 2
