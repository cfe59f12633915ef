"""The comparison report rendered from hand-made results: no model, no training."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _support import tiny_config
from PIL import Image

from lm.compare.report import PICTURES, RunResult, labels, render, write_report
from lm.config.errors import LMError

PROMPT = "def f"
SHA = "ab" * 32
LEARNED_NOTE = "learned positions stop at 32: no vector for longer contexts"
TOO_LONG = "too long for this test"


def result(position: str, seed: int, **measured) -> RunResult:
    """A run of the tiny config as if trained for 16 steps and measured at 32, 64, 128."""
    config = tiny_config(model={"position": position}, train={"seed": seed})
    losses = measured.pop("extrapolation")
    rows = []
    for length, loss in zip((32, 64, 128), losses, strict=True):
        row = {"context_length": length, "requested": f"{length // 32}x", "trained_context": 32}
        row["loss"] = loss
        if loss is None:
            row["note"] = LEARNED_NOTE if position == "learned" else TOO_LONG
        else:
            row.update(windows=4096 // length, window=length)
        rows.append(row)
    metrics = [
        {"step": s, "train_loss": 4.0 - s / 10 - seed / 100, "elapsed_s": s * 2.0 + seed}
        for s in (5, 10, 15)
    ] + [{"step": s, "val_loss": 4.0 - s / 8, "elapsed_s": s * 2.0 + seed} for s in (8, 16)]
    defaults = {
        "run_dir": Path(f"sweep/position={position}/seed{seed}"),
        "config": config,
        "parameters": 28128,
        "step": 16,
        "tokens_seen": 16 * 8 * 32,
        "tokens_exact": True,
        "tokenizer_sha256": SHA,
        "data_cache": "/cache/data/0123456789abcdef0123",
        "eval_batches": 2,
        "metrics": metrics,
        "extrapolation": rows,
        "continuation": f" x{seed}",
    }
    return RunResult(**{**defaults, **measured})


@pytest.fixture
def results() -> list[RunResult]:
    return [
        result(
            "rope",
            1,
            final_val_loss=2.0,
            best_val_loss=1.9,
            tokens_per_s=1000.0,
            wall_s=30.0,
            extrapolation=[2.0, 2.5, 3.0],
            continuation=" x | y\nz",
        ),
        result(
            "rope",
            2,
            final_val_loss=2.2,
            best_val_loss=2.1,
            tokens_per_s=3000.0,
            wall_s=90.0,
            extrapolation=[2.2, 2.5, None],
        ),
        result(
            "learned",
            1,
            parameters=29152,
            tokens_exact=False,
            tokens_seen=4000,
            final_val_loss=2.5,
            best_val_loss=2.4,
            tokens_per_s=2000.0,
            wall_s=5.0,
            extrapolation=[2.5, None, None],
        ),
        result(
            "learned",
            2,
            parameters=29152,
            tokens_exact=False,
            tokens_seen=4100,
            final_val_loss=2.5,
            best_val_loss=2.4,
            tokens_per_s=None,
            wall_s=None,
            extrapolation=[2.5, None, None],
        ),
    ]


def rows(markdown: str, width: int) -> dict[str, list[list[str]]]:
    """Markdown table rows of ``width`` cells, by their first cell."""
    found: dict[str, list[list[str]]] = {}
    for line in markdown.splitlines():
        if line.startswith("| "):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if len(cells) == width:
                found.setdefault(cells[0], []).append(cells)
    return found


def test_the_table_has_one_row_per_scheme_with_mean_and_std_over_seeds(results, tmp_path):
    markdown = write_report(results, tmp_path, PROMPT, 12)
    assert markdown == (tmp_path / "report.md").read_text(encoding="utf-8")
    table, lengths = rows(markdown, 9), rows(markdown, 4)
    assert table["position"] == [
        [
            "position",
            "seeds",
            "parameters",
            "steps",
            "tokens seen",
            "final val loss",
            "best val loss",
            "tokens/s",
            "wall time",
        ]
    ]
    assert lengths["position"] == [
        ["position", "val loss @32 (1×)", "val loss @64 (2×)", "val loss @128 (4×)"]
    ]
    # mean ± sample std over the two seeds; equal values stand alone; any missing one: n/a
    assert table["rope"] == [
        [
            "rope",
            "2",
            "28,128",
            "16",
            "4,096",
            "2.1000 ± 0.1414",
            "2.0000 ± 0.1414",
            "2,000 ± 1,414",
            "1m 00s",
        ]
    ]
    assert lengths["rope"] == [["rope", "2.1000 ± 0.1414", "2.5000", "n/a [1]"]]
    assert table["learned"] == [
        [
            "learned",
            "2",
            "29,152",
            "16",
            "≈4,050",
            "2.5000",
            "2.4000",
            "n/a",
            "n/a",
        ]
    ]
    assert lengths["learned"] == [["learned", "2.5000", "n/a [2]", "n/a [2]"]]
    # footnotes: numbered in the order they first appear, each given once
    assert f"\n[1] {TOO_LONG}\n" in markdown and f"\n[2] {LEARNED_NOTE}\n" in markdown
    assert markdown.count(LEARNED_NOTE) == 1
    assert markdown.startswith("# Runs compared by position\n")
    assert "4 runs: 2 values of position, 2 seeds each." in markdown
    assert f"All 4 runs share one tokenizer (tokenizer.json sha256 `{SHA[:16]}`)" in markdown
    assert "(`0123456789abcdef0123`)" in markdown
    assert "on the first 2 batches of the validation split" in markdown
    assert "Windows read: 128 at 32, 64 at 64, 32 at 128." in markdown


def test_every_run_continues_the_prompt_in_one_escaped_cell(results, tmp_path):
    continuations = rows(write_report(results, tmp_path, PROMPT, 12), 3)
    assert continuations["position"][0][2].startswith("continuation (12 tokens at most")
    assert continuations["rope"] == [["rope", "1", "def f x \\| y↵z"], ["rope", "2", "def f x2"]]
    assert continuations["learned"] == [["learned", "1", "def f x1"], ["learned", "2", "def f x2"]]


def test_the_pictures_exist_are_real_images_and_are_linked(results, tmp_path):
    markdown = write_report(results, tmp_path, PROMPT, 12)
    for name in PICTURES:
        with Image.open(tmp_path / name) as image:
            image.verify()
        with Image.open(tmp_path / name) as image:
            assert min(image.size) > 100, name
        assert f"![{Path(name).stem.replace('_', ' ')}]({name})" in markdown


def test_report_json_holds_every_run_s_numbers(results, tmp_path):
    write_report(results, tmp_path, PROMPT, 12)
    data = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert data["compared"] == "position" and data["prompt"] == PROMPT
    runs = data["runs"]
    assert [(r["label"], r["seed"]) for r in runs] == [
        ("rope", 1),
        ("rope", 2),
        ("learned", 1),
        ("learned", 2),
    ]
    first = runs[0]
    assert first["run_dir"] == str(Path("sweep/position=rope/seed1"))
    assert first["final_val_loss"] == 2.0 and first["tokens_per_s"] == 1000.0
    assert first["trained_context"] == 32 and first["eval_batches"] == 2
    assert first["extrapolation"] == results[0].extrapolation
    assert runs[3]["wall_s"] is None and runs[3]["tokens_exact"] is False
    assert runs[3]["extrapolation"][1]["note"] == LEARNED_NOTE
    assert "metrics" not in first and "config" not in first  # they live in the run's own files


def test_runs_that_do_not_share_their_data_are_told_apart(results):
    other = [*results[:3], dataclasses.replace(results[3], tokenizer_sha256="cd" * 32)]
    markdown, _ = render(other, PROMPT, 12)
    assert "do not all share their data: 2 distinct tokenizers and 1 token-id caches" in markdown


def test_labels_name_what_differs_besides_the_seed():
    rope, alibi = (tiny_config(model={"position": p}) for p in ("rope", "alibi"))
    assert labels([rope, alibi]) == ("position", ["rope", "alibi"])
    seeds = [tiny_config(train={"seed": s}) for s in (1, 2)]
    assert labels(seeds) == ("run", ["same config", "same config"])
    two = tiny_config(model={"position": "alibi"}, train={"lr": 1e-3})
    assert labels([rope, two]) == ("runs", ["position=rope, lr=0.003", "position=alibi, lr=0.001"])
    # Several keys: each run names the key of most values, another only where the run leaves
    # the value most runs share.
    none, breaking = (
        tiny_config(model={"position": "none", "normalize": n})
        for n in ("softmax", "stick_breaking")
    )
    assert labels([rope, alibi, none, breaking]) == (
        "runs",
        [
            "position=rope",
            "position=alibi",
            "position=none",
            "position=none, normalize=stick_breaking",
        ],
    )
    hybrid = tiny_config(model={"position": ["rope", "none"]})  # as YAML writes a list inline
    assert labels([rope, hybrid]) == ("position", ["rope", "[rope, none]"])
    # None and booleans as YAML writes them, as a user would type them to --vary.
    randomized = tiny_config(model={"random_positions": 128})
    assert labels([rope, randomized]) == ("random_positions", ["null", "128"])
    unscaled = tiny_config(model={"position": "sinusoidal", "scale_embeddings": False})
    scaled = tiny_config(model={"position": "sinusoidal"})
    assert labels([scaled, unscaled]) == ("scale_embeddings", ["true", "false"])
    # lm compare --jobs gives the last runs more threads: the same numbers, not another run.
    alone = tiny_config(model={"position": "alibi"}, train={"threads": 2})
    assert labels([tiny_config(train={"threads": 1}), alone]) == ("position", ["rope", "alibi"])


def test_labels_of_a_sweep_of_parts_name_what_each_run_changes():
    # --vary model.position=none+model.norm=rmsnorm,none+model.mlp=swiglu: no key has the most
    # values, so each run names its own change, not a key it shares with the others.
    parts = [tiny_config(model={"norm": "rmsnorm"}), tiny_config(model={"mlp": "swiglu"})]
    parts.append(tiny_config(model={"tie_embeddings": False}))
    assert labels(parts) == ("runs", ["norm=rmsnorm", "mlp=swiglu", "tie_embeddings=false"])
    # --vary data.addition_reversed=true,false,true+data.addition_hints=true over 3 seeds: the
    # run that changes nothing names every key, so no row reads as another's.
    plain = {"source": "builtin:addition", "task_lengths": "1-3", "task_eval_lengths": "1-4"}
    reversed_, forward, hinted = (
        tiny_config(data={**plain, "addition_reversed": r, "addition_hints": h})
        for r, h in ((True, False), (False, False), (True, True))
    )
    assert labels([reversed_] * 3 + [forward] * 3 + [hinted] * 3)[1][::3] == [
        "addition_hints=false, addition_reversed=true",
        "addition_reversed=false",
        "addition_hints=true",
    ]


def test_a_one_value_sweep_is_one_group_whatever_threads_its_runs_had():
    # lm compare --jobs trains its last run alone on every core (threads null), the others on
    # one thread each: the same numbers, so one row, not two.
    configs = [tiny_config(train={"threads": t, "seed": s}) for t, s in ((1, 1), (1, 2), (None, 3))]
    assert labels(configs) == ("run", ["same config"] * 3)


def test_no_results_is_an_error_and_writes_nothing(tmp_path):
    with pytest.raises(LMError, match="no runs to report on"):
        write_report([], tmp_path / "out", PROMPT, 12)
    assert not (tmp_path / "out").exists()


def test_evaluation_time_extensions_are_rows_of_the_length_table_only(results, tmp_path):
    rope = [r for r in results if r.config.model.position == "rope"]
    yarn = [
        dataclasses.replace(
            r,
            rope_scaling="yarn:4",
            extrapolation=[
                {**row, "loss": None if row["loss"] is None else row["loss"] - 0.25}
                for row in r.extrapolation
            ],
        )
        for r in rope
    ]
    markdown = write_report([*rope, *yarn, *results[2:]], tmp_path, PROMPT, 12)
    table, lengths = rows(markdown, 9), rows(markdown, 4)
    assert list(table) == ["position", "rope", "learned"]  # trained runs, each once
    assert table["rope"][0][1] == "2"
    assert list(lengths) == ["position", "rope", "rope + yarn:4", "learned"]
    assert lengths["rope + yarn:4"] == [["rope + yarn:4", "1.8500 ± 0.1414", "2.2500", "n/a [1]"]]
    assert "4 runs: 2 values of position, 2 seeds each. All 4 runs share" in markdown
    assert "`rope + yarn:4`: the same trained runs, evaluated with that RoPE" in markdown
    continuations = rows(markdown, 3)
    assert [c[:2] for c in continuations["rope + yarn:4"]] == [
        ["rope + yarn:4", "1"],
        ["rope + yarn:4", "2"],
    ]
    data = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert [(r["label"], r["rope_scaling"]) for r in data["runs"]][2:4] == [
        ("rope + yarn:4", "yarn:4"),
        ("rope + yarn:4", "yarn:4"),
    ]
    with Image.open(tmp_path / "loss_vs_context.png") as image:
        assert min(image.size) > 100


def test_one_trained_config_evaluated_with_each_extension_is_compared_by_rope_scaling(results):
    rope = [r for r in results if r.config.model.position == "rope"]
    variants = [dataclasses.replace(r, rope_scaling=v) for v in (None, "pi:4") for r in rope]
    same = [dataclasses.replace(r, config=rope[0].config) for r in variants]
    markdown, numbers = render(same, PROMPT, 12)
    assert markdown.startswith("# Runs compared by rope_scaling\n")
    assert list(rows(markdown, 4)) == ["rope_scaling", "none", "pi:4"]
    assert numbers["compared"] == "rope_scaling"


def test_task_runs_add_accuracy_by_length_in_bins_with_the_trained_lengths_marked(
    results, tmp_path
):
    def accuracy(values: list[float]) -> list[dict]:  # lengths 1-10, trained on 1-4
        return [
            {
                "length": n,
                "accuracy": a,
                "correct": round(10 * a),
                "examples": 10,
                "trained": n <= 4,
            }
            for n, a in zip(range(1, 11), values, strict=True)
        ]

    rope1 = [1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2, 0, 0]
    rope2 = [1, 1, 1, 1, 0.6, 0.4, 0.2, 0.0, 0, 0]
    learned = [1, 1, 1, 0.8, 0, 0, 0, 0, 0, 0]
    tasks = [
        dataclasses.replace(r, accuracy=accuracy(v))
        for r, v in zip(results, [rope1, rope2, learned, learned], strict=True)
    ]
    markdown = write_report(tasks, tmp_path, PROMPT, 12)
    assert "| position | 1–4 (trained) | 5–6 | 7–8 | 9–10 | all unseen |" in markdown
    table = rows(markdown, 6)
    # Each cell: the mean over its lengths per run, then mean ± std over the seeds.
    assert table["rope"] == [
        ["rope", "100.0%", "60.0% ± 14.1%", "20.0% ± 14.1%", "0.0%", "26.7% ± 9.4%"]
    ]
    assert table["learned"] == [["learned", "95.0%", "0.0%", "0.0%", "0.0%", "0.0%"]]
    assert "![accuracy against length](accuracy_vs_length.png)" in markdown
    with Image.open(tmp_path / "accuracy_vs_length.png") as image:
        image.verify()
    data = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert data["runs"][0]["accuracy"] == accuracy(rope1)
    # Runs on text have no accuracy: no such section, no such picture.
    plain = write_report(results, tmp_path / "text", PROMPT, 12)
    assert "accuracy" not in plain and not (tmp_path / "text" / "accuracy_vs_length.png").exists()


def test_task_runs_asked_at_different_lengths_share_one_table(results, tmp_path):
    def accuracy(lengths: range, value: float) -> list[dict]:
        return [
            {"length": n, "accuracy": value, "correct": 1, "examples": 10, "trained": n <= 4}
            for n in lengths
        ]

    # lm compare runs/a runs/b of two task runs asked at 1-16 and at 1-10.
    tasks = [
        dataclasses.replace(results[0], accuracy=accuracy(range(1, 17), 0.5)),
        dataclasses.replace(results[2], accuracy=accuracy(range(1, 11), 0.25)),
    ]
    markdown = write_report(tasks, tmp_path, PROMPT, 12)
    header = next(line for line in markdown.splitlines() if "(trained)" in line)
    assert header == "| position | 1–4 (trained) | 5–7 | 8–10 | 11–13 | 14–16 | all unseen |"
    table = rows(markdown, 7)
    assert table["rope"] == [["rope", "50.0%", "50.0%", "50.0%", "50.0%", "50.0%", "50.0%"]]
    assert table["learned"] == [["learned", "25.0%", "25.0%", "25.0%", "n/a", "n/a", "25.0%"]]
    assert "asked at different lengths" in markdown
