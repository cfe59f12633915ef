"""Generated tasks: their examples, the loss on answers only, exact-match accuracy by length
(lm eval, lm compare), and their bad settings refused at load."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _support import assert_one_line, expect_error, tiny_config, write_config

import lm.evaluate
from lm.cli import main
from lm.config.errors import ConfigError
from lm.config.load import load_config
from lm.config.names import task_tokens
from lm.config.sections import DataConfig
from lm.config.values import parse_task_lengths
from lm.data.batches import TrainBatches, eval_batches, trained_targets
from lm.data.sources import prepare_data
from lm.data.tasks import TaskSettings, evaluation_examples, training_examples
from lm.runs.load import load_run

COPY = {
    "source": "builtin:copy",
    "mode": "padded",
    "task_lengths": "1-3",
    "task_eval_lengths": "1-5",
}


def task_config(root, task="copy", **data):
    data = {**COPY, "source": f"builtin:{task}", "cache_dir": str(root / "cache"), **data}
    return tiny_config(data=data, train={"eval_every": 0})


def test_examples_say_what_each_task_asks():
    for prompt, answer in training_examples("copy", range(1, 6), 50, seed=3):
        assert prompt.endswith("=") and answer == prompt[:-1] and 1 <= len(answer) <= 5
        assert set(answer) <= set("abcdefghij")
    for prompt, answer in training_examples("reverse", range(4, 5), 20, seed=3):
        assert answer == prompt[:-1][::-1] and len(answer) == 4
    for prompt, answer in training_examples("addition", range(3, 4), 50, seed=3):
        a, b = prompt[:-1].split("+")
        assert len(a) == len(b) == 3 and a[0] != "0" and int(answer) == int(a) + int(b)
    # The longest example of each length fits in task_tokens(task, length), <eod> included.
    for task in ("copy", "reverse", "addition"):
        for length in (1, 4, 9):
            sizes = [len(p + a) + 1 for p, a in (training_examples(task, [length], 200, 1))]
            assert max(sizes) <= task_tokens(task, length)
    assert task_tokens("addition", 2) == len("99+99=198") + 1
    # The same seed, the same examples, whatever else changes; evaluation draws its own.
    assert training_examples("copy", range(1, 6), 20, 3) == training_examples(
        "copy", range(1, 6), 20, 3
    )
    assert training_examples("copy", range(1, 6), 20, 3) != training_examples(
        "copy", range(1, 6), 20, 4
    )
    assert evaluation_examples("copy", 7, 5, 3) == evaluation_examples("copy", 7, 5, 3)
    assert {len(a) for _, a in evaluation_examples("copy", 7, 5, 3)} == {7}


def memory_of(program: str) -> int:
    """The flip-flop memory after a program (pairs of a letter and a bit), by the paper's
    definition: the bit of the last write."""
    writes = [int(program[i + 1]) for i in range(0, len(program), 2) if program[i] == "w"]
    return writes[-1]


def test_a_flip_flop_program_writes_first_reads_last_and_its_answer_is_the_last_write():
    programs = training_examples("flipflop", range(2, 40), 400, 3, TaskSettings(ignore=0.8))
    for prompt, answer in programs:
        program = prompt + answer
        pairs = [program[i : i + 2] for i in range(0, len(program), 2)]
        assert pairs[0][0] == "w" and pairs[-1][0] == "r" and 2 <= len(pairs) <= 39
        assert all(p[0] in "wir" and p[1] in "01" for p in pairs)
        # Every read, the last (the answer) and those before it, gives the memory's bit.
        for k, pair in enumerate(pairs):
            if pair[0] == "r":
                assert int(pair[1]) == memory_of("".join(pairs[:k])), program
        assert len(prompt) + len(answer) + 1 == task_tokens("flipflop", len(pairs))
    # The ignore rate is the paper's FFL(p): instructions between the first and the last.
    for rate in (0.1, 0.8, 0.98):
        drawn = evaluation_examples("flipflop", 50, 200, 1, TaskSettings(ignore=rate))
        middle = "".join(p[2:-1:2] for p, _ in drawn)
        assert abs(middle.count("i") / len(middle) - rate) < 0.02
        assert abs(middle.count("w") - middle.count("r")) / len(middle) < 0.03
    # Splits draw their own programs; the same split, the same programs.
    rate = TaskSettings(ignore=0.8)
    assert evaluation_examples("flipflop", 9, 5, 1, rate, 0) != evaluation_examples(
        "flipflop", 9, 5, 1, rate, 1
    )
    assert evaluation_examples("flipflop", 9, 5, 1, rate, 2) == evaluation_examples(
        "flipflop", 9, 5, 1, rate, 2
    )


def test_lengths_read_as_ranges():
    assert parse_task_lengths("1-20", "k") == range(1, 21) and parse_task_lengths(
        " 8 ", "k"
    ) == range(8, 9)
    for bad in ("20-1", "0-3", "a-b", "1-", ""):
        with pytest.raises(ConfigError, match="k: "):
            parse_task_lengths(bad, "k")


FITS = ["data.task_lengths=1-3", "data.task_eval_lengths=1-5"]


@pytest.mark.parametrize(
    "settings, message",
    [
        (["data.source=builtin:sorting"], "data.source: unknown builtin 'builtin:sorting'"),
        (["data.task_lengths=1-5"], "data.task_lengths: applies to the builtin tasks"),
        (["data.source=builtin:copy", *FITS, "data.task_lengths=5-1"], "'5-1' must go from"),
        (
            ["data.source=builtin:copy", *FITS, "data.task_eval_lengths=1-20"],
            "data.task_eval_lengths: copy at length 20 makes examples of 42 tokens with <eod>, "
            "more than model.context_length=32 + 1",
        ),
        (
            ["data.source=builtin:addition", *FITS, "data.task_lengths=1-10"],
            "data.task_lengths: addition at length 10 makes examples of 34 tokens",
        ),
        (["data.source=builtin:copy", *FITS, "data.task_examples=1"], "at least 2"),
        (
            ["data.source=builtin:copy", *FITS, "data.flipflop_ignore=0.5"],
            "data.flipflop_ignore: applies to data.source: builtin:flipflop only",
        ),
        (
            [
                "data.source=builtin:flipflop",
                "data.task_lengths=4",
                "data.task_eval_lengths=4",
                "data.flipflop_ignore=1.0",
            ],
            "data.flipflop_ignore: must be in [0, 1)",
        ),
        (
            ["data.source=builtin:flipflop", "data.task_lengths=1-4", "data.task_eval_lengths=4"],
            "data.task_lengths: flip-flop programs have at least 2 instructions",
        ),
        (
            ["data.source=builtin:flipflop", "data.task_lengths=4", "data.task_eval_lengths=17"],
            "data.task_eval_lengths: flipflop at length 17 makes examples of 35 tokens",
        ),
    ],
)
def test_bad_task_settings_are_one_line_before_any_data_is_prepared(
    settings, message, tmp_path, capsys
):
    config = write_config(tmp_path / "c.yaml", data={"cache_dir": str(tmp_path / "cache")})
    with pytest.raises(ConfigError) as e:
        load_config(config, settings)
    assert_one_line(e, message)
    argv = ["train", str(config), "--out", str(tmp_path / "run"), "--set", *settings]
    expect_error(capsys, argv, message)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_the_loss_is_on_the_answers_and_their_end_only(tmp_path):
    cfg = task_config(tmp_path, task_examples=40)
    data = prepare_data(cfg.data, log=None)
    tok = data.tokenizer
    a, b = data.train.offsets[:2]
    first = tok.decode(data.train.tokens[a:b].tolist()).removesuffix("<eod>")
    assert data.train.answers[0] == first.index("=") + 1  # the answer starts after "="
    for mode in ("padded", "packed"):
        batches = TrainBatches(
            data.train, DataConfig(**{**cfg.data.__dict__, "mode": mode}), 12, 8, 1, tok.pad_id, 1
        )
        (batch,), n_targets = batches.step(0)
        assert n_targets == int(batch["loss_mask"].sum())  # normalised by the answers' count
        for targets, counted in zip(batch["targets"], batch["loss_mask"], strict=True):
            trained = tok.decode(targets[counted].tolist())
            # Each answer's characters and its <eod>, never a prompt's: copy answers hold no "=".
            assert ("=" not in trained and trained.endswith("<eod>")) or mode == "packed"
            assert "=" not in trained
        if mode == "padded":
            for ids, targets, counted in zip(
                batch["input_ids"], batch["targets"], batch["loss_mask"], strict=True
            ):
                prompt = tok.decode(ids[: int(batch["key_mask"][0].sum())].tolist()).split("=")[0]
                assert tok.decode(targets[counted].tolist()).startswith(prompt[:1])
    (val,) = list(eval_batches(data.val, cfg.data, 12, 100, tok.pad_id))
    assert 0 < int(val["loss_mask"].sum()) < int(val["key_mask"].sum())
    answers = trained_targets(data.val, data.val.offsets[:-1], np.diff(data.val.offsets))
    assert int(answers.sum()) == int(val["loss_mask"].sum())


def test_accuracy_counts_an_answer_only_when_every_token_and_its_end_are_right(
    tmp_path, monkeypatch
):
    cfg = task_config(tmp_path, task_eval_lengths="2-4", task_eval_examples=6)
    cfg = cfg.replace(train=cfg.train.__class__(**{**cfg.train.__dict__, "max_steps": 1}))
    from lm.training.loop import train

    train(cfg, tmp_path / "run", quiet=True)
    run = load_run(tmp_path / "run")
    tok = run.tokenizer
    answers = {}

    def oracle(model, prompts, max_new_tokens, pad_id, eod_id, seed=None):
        out = []
        for p in prompts:
            answer = tok.encode(answers[tuple(p)])
            out.append(answer if len(answer) != 3 else answer[:-1])  # wrong at length 3
        assert max_new_tokens == max(len(tok.encode(answers[tuple(p)])) for p in prompts) + 1
        return out

    for length in range(2, 5):
        for p, a in evaluation_examples("copy", length, 6, cfg.data.seed):
            answers[tuple(tok.encode(p))] = a
    monkeypatch.setattr(lm.evaluate, "generate", oracle)
    rows = lm.evaluate.task_accuracy(run)
    assert [(r["length"], r["accuracy"], r["trained"]) for r in rows] == [
        (2, 1.0, True),
        (3, 0.0, True),
        (4, 1.0, False),
    ]


def test_a_tiny_model_learns_to_copy_and_lm_eval_reports_accuracy_by_length(tmp_path, capsys):
    config = write_config(
        tmp_path / "copy.yaml",
        model={"d_model": 64, "n_head": 4},
        data={**COPY, "task_examples": 4000, "task_eval_examples": 20},
        train={"max_steps": 400, "batch_size": 32, "eval_every": 0, "checkpoint_every": 400},
    )
    out, cache = str(tmp_path / "run"), f"data.cache_dir={tmp_path / 'cache'}"
    assert main(["train", str(config), "--out", out, "--quiet", "--set", cache]) == 0
    capsys.readouterr()
    assert main(["eval", out]) == 0
    printed = capsys.readouterr().out
    assert "Exact-match accuracy of the answers, by length" in printed
    # Its loss is over whole examples, not windows of a text that a length could reach.
    assert "no window" not in printed and "each read whole" in printed, printed
    rows = json.loads((tmp_path / "run" / "eval.json").read_text())["accuracy"]
    assert [r["length"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["trained"] for r in rows] == [True, True, True, False, False]
    trained = [r["accuracy"] for r in rows if r["trained"]]
    assert sum(trained) / 3 >= 0.8, rows  # learned where it was trained (0.95 when written)
    assert f"| 1 | {rows[0]['accuracy']:.1%} | {rows[0]['correct']}/20 | yes |" in printed


def test_lm_compare_reports_accuracy_against_length_over_seeds(tmp_path, monkeypatch):
    import statistics

    import lm.compare.measure

    # Four steps teach nothing (every answer wrong), so each run's answers are marked afresh,
    # differently per scheme, seed and length, for the table's averaging to show: a cell is the
    # mean over its lengths, then mean ± std over the seeds.
    asked = lm.compare.measure.task_accuracy

    def marked(run, *args, **kwargs):
        rows = asked(run, *args, **kwargs)
        rope, seed = run.config.model.position == "rope", run.config.train.seed
        for row in rows:
            row["correct"] = (3 * seed + 2 * row["length"] + 3 * rope) % (row["examples"] + 1)
            row["accuracy"] = row["correct"] / row["examples"]
        return rows

    monkeypatch.setattr(lm.compare.measure, "task_accuracy", marked)
    config = write_config(
        tmp_path / "copy.yaml",
        data={**COPY, "task_examples": 200, "task_eval_examples": 5},
        train={"max_steps": 4, "eval_every": 0, "checkpoint_every": 4},
    )
    out = tmp_path / "sweep"
    argv = ["compare", str(config), "--vary", "model.position=rope,none", "--seeds", "1,2"]
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    assert main([*argv, "--set", cache, "--out", str(out), "--max-new-tokens", "4", "--quiet"]) == 0
    markdown = (out / "report.md").read_text()
    assert "## Exact-match accuracy by length" in markdown
    assert "| position | 1–3 (trained) | 4 | 5 | all unseen |" in markdown
    section = markdown.split("## Exact-match accuracy by length")[1]
    for scheme in ("rope", "none"):
        row = next(line for line in section.splitlines() if line.startswith(f"| {scheme} | "))
        cells = row.strip().strip("|").split(" | ")
        assert len(cells) == 5, row
        rope = scheme == "rope"
        for cell, lengths in zip(cells[1:], ([1, 2, 3], [4], [5], [4, 5]), strict=True):
            per_seed = [
                statistics.mean((3 * seed + 2 * n + 3 * rope) % 6 / 5 for n in lengths)
                for seed in (1, 2)
            ]
            mean, std = statistics.mean(per_seed), statistics.stdev(per_seed)
            expected = f"{mean:.1%}" if std == 0 else f"{mean:.1%} ± {std:.1%}"
            assert cell.strip() == expected, (scheme, lengths, row)
    assert (out / "accuracy_vs_length.png").is_file()
    # What task runs measure is drawn; a loss against contexts no example reaches is not.
    assert not (out / "loss_vs_context.png").exists()
    assert "Validation loss by evaluation length" not in markdown and "no window" not in markdown
    runs = json.loads((out / "report.json").read_text())["runs"]
    assert len(runs) == 4 and all(len(r["accuracy"]) == 5 for r in runs)
    assert [row["context_length"] for row in runs[0]["extrapolation"]] == [32]  # 1x only
    # The continuations start from a prompt of the task, not from a text it never saw.
    assert runs[0]["continuation"] is not None and "=" in markdown.split("Greedy continuations")[1]


FLIPFLOP = {
    "source": "builtin:flipflop",
    "mode": "padded",
    "task_lengths": "8",
    "task_eval_lengths": "8",
}


def test_flip_flop_is_asked_in_three_splits_by_lm_eval_and_lm_compare(tmp_path, capsys):
    config = write_config(
        tmp_path / "ff.yaml",
        data={**FLIPFLOP, "task_examples": 300, "task_eval_examples": 6},
        train={"max_steps": 4, "eval_every": 0, "checkpoint_every": 4},
    )
    out = tmp_path / "sweep"
    argv = ["compare", str(config), "--vary", "model.position=rope,none", "--seeds", "1,2"]
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    assert main([*argv, "--set", cache, "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    markdown = (out / "report.md").read_text()
    assert "## Exact-match accuracy by split" in markdown
    assert "ignore rates: in-distribution 0.8, sparse 0.98, dense 0.1" in markdown
    assert "| position | in-distribution | sparse | dense |" in markdown
    assert (out / "errors_by_split.png").is_file() and not (out / "accuracy_vs_length.png").exists()
    runs = json.loads((out / "report.json").read_text())["runs"]
    rows = runs[0]["accuracy"]
    assert [(r["split"], r["length"], r["trained"]) for r in rows] == [
        ("in-distribution", 8, True),
        ("sparse", 8, False),
        ("dense", 8, False),
    ]
    # lm eval prints the same rows, each split named.
    run = next(p for p in out.rglob("run.json")).parent
    assert main(["eval", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "| split | length | exact match | correct | trained |" in printed
    assert "| sparse | 8 |" in printed and "| in-distribution | 8 |" in printed
