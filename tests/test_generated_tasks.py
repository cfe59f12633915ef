"""The tasks each family of position schemes was invented for (lm/data/tasks.py): counting,
selective copy, multi-query associative recall, indirect indexing, parity, and addition with
index hints and reversed answers. Each is drawn from data.seed alone, its answers are checked
here by reading the prompt text again, its splits differ as named, its bad settings are one line,
and its accuracy per split reaches lm eval and lm compare. Also: positions drawn at evaluation
(model.random_positions_eval)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from _support import assert_one_line, expect_error, tiny_config, write_config

from lm.cli import main
from lm.compare.diagnostics import draw_attention
from lm.config.errors import ConfigError
from lm.config.load import load_config
from lm.config.names import task_tokens
from lm.data.sources import prepare_data
from lm.data.tasks import (
    TaskSettings,
    alphabet,
    evaluation_examples,
    splits,
    training_examples,
)
from lm.explorer.gather import prompt_view
from lm.model.transformer import TransformerLM
from lm.runs.load import load_run
from lm.sample import generate

NEW = ("counting", "selective_copy", "mqar", "indexing", "parity")


@pytest.mark.parametrize("task", [*NEW, "addition"])
def test_each_task_is_drawn_from_the_seed_alone_and_fits_its_token_count(task):
    settings = TaskSettings(hints=True, reversed=True) if task == "addition" else TaskSettings()
    lengths = range(2, 13)
    drawn = training_examples(task, lengths, 60, 5, settings)
    assert drawn == training_examples(task, lengths, 60, 5, settings)
    assert drawn != training_examples(task, lengths, 60, 6, settings)
    assert evaluation_examples(task, 9, 8, 5, settings) == evaluation_examples(
        task, 9, 8, 5, settings
    )
    assert evaluation_examples(task, 9, 8, 5, settings) != evaluation_examples(
        task, 9, 8, 6, settings
    )
    for prompt, answer in drawn:
        assert prompt.endswith("=") and answer
        assert set(prompt + answer) <= set(alphabet(task, settings))
    # The longest example of each length fits the count the config checks the context with.
    for length in (2, 7, 12):
        sizes = [len(p + a) + 1 for p, a in evaluation_examples(task, length, 300, 1, settings)]
        assert max(sizes) <= task_tokens(task, length, settings.hints)


def run_counting(program: str) -> dict[str, int]:
    """The variables after a counting program, by executing its statements."""
    values: dict[str, int] = {}
    for statement in program.split(";"):
        if statement.endswith("=0"):
            values[statement[0]] = 0
        elif statement.endswith("++"):
            values[statement[0]] += 1  # a KeyError: an increment of a variable never set
        else:
            assert statement == "pass", statement
    return values


def test_counting_answers_the_value_its_program_leaves_and_more_pass_spreads_increments():
    def pass_share(settings: TaskSettings) -> float:
        programs = [p for p, _ in evaluation_examples("counting", 40, 100, 2, settings)]
        statements = [s for p in programs for s in p.split(";")]
        return sum(s == "pass" for s in statements) / len(statements)

    for settings in (TaskSettings(variables=1), TaskSettings(variables=3)):
        for prompt, answer in training_examples("counting", range(1, 30), 300, 4, settings):
            body, asked = prompt.removesuffix("=").rsplit("print ", 1)
            assert body.count(";") == len(body.split(";")) - 1 and body.endswith(";")
            values = run_counting(body[:-1])
            assert set(values) <= set("xyz"[: settings.variables])
            assert int(answer) == values[asked] and 0 <= int(answer) <= 10
    lengths = {len(p.split(";")) - 1 for p, _ in evaluation_examples("counting", 17, 20, 1)}
    assert lengths == {17}  # a length is the number of statements
    (_, trained), (name, more) = splits("counting", TaskSettings())
    assert name == "more pass" and pass_share(more) > pass_share(trained) + 0.05
    answers = [int(a) for _, a in evaluation_examples("counting", 40, 300, 2)]
    assert len(set(answers)) >= 4  # counts, not one constant answer
    # Long programs of one variable count up to the paper's cap of 10, never past it.
    one = TaskSettings(variables=1)
    assert max(int(a) for _, a in evaluation_examples("counting", 300, 40, 2, one)) == 10


def test_a_task_tokenizer_reads_every_character_of_the_task_even_those_training_never_wrote(
    tmp_path,
):
    # Programs of 1 or 2 statements count to 1 at most: no training answer is an 8.
    data = {"source": "builtin:counting", "mode": "padded", "task_lengths": "1-2"}
    data |= {"counting_variables": 1}
    data |= {"task_eval_lengths": "2", "task_examples": 50, "cache_dir": str(tmp_path)}
    prepared = prepare_data(tiny_config(data=data).data, log=None)
    tokenizer = prepared.tokenizer
    texts = tokenizer.decode(prepared.train.tokens.tolist())
    assert "8" not in texts and "z" not in texts  # one variable, x
    assert tokenizer.unk_id not in tokenizer.encode("x=0;y++;z++;print z=8")


def test_selective_copy_answers_the_symbols_in_order_and_its_splits_change_the_density():
    for prompt, answer in training_examples("selective_copy", range(1, 40), 300, 4):
        assert answer == prompt[:-1].replace(".", "")
    counts = {}
    for name, settings in splits("selective_copy", TaskSettings(density=0.25)):
        examples = evaluation_examples("selective_copy", 32, 20, 1, settings)
        counts[name] = {len(a) for _, a in examples}
        assert {len(p) for p, _ in examples} == {33}
    assert counts == {"in-distribution": {8}, "dense": {16}, "sparse": {4}}


def test_mqar_recalls_the_value_of_the_last_query_from_the_pairs():
    for pairs in (1, 4, 8, 20):
        for prompt, answer in evaluation_examples("mqar", pairs, 100, 3):
            kv, region = prompt[: 2 * pairs], prompt[2 * pairs :]
            table = {kv[i]: kv[i + 1] for i in range(0, len(kv), 2)}
            assert len(table) == pairs and set(table.values()) <= set("0123456789")
            queries = re.findall(r"([a-z])=(\d?)", region)
            # Every key is queried once; the answered ones are right; the last one is asked.
            assert sorted(k for k, _ in queries) == sorted(table)
            assert all(table[k] == v for k, v in queries[:-1]) and queries[-1][1] == ""
            assert answer == table[queries[-1][0]]
            assert region.count(".") + len(queries) <= 3 * pairs
    # The power law puts most queries soon after the pairs: the first slot is a query far more
    # often than the last of the region would be.
    first = [p[16] != "." for p, _ in evaluation_examples("mqar", 8, 300, 3)]
    assert sum(first) / len(first) > 0.5


def test_indexing_answers_the_letter_its_offset_away():
    for length in (2, 5, 26):
        for prompt, answer in evaluation_examples("indexing", length, 100, 3):
            letters, query = prompt[:-1].split("|")
            assert len(letters) == len(set(letters)) == length
            source, shift = query[0], int(query[1:])
            assert shift != 0 and answer == letters[letters.index(source) + shift]


def test_parity_answers_whether_the_ones_are_odd():
    for prompt, answer in training_examples("parity", range(1, 30), 300, 4):
        assert set(prompt[:-1]) <= {"0", "1"}
        assert answer == str(prompt.count("1") % 2)
    answers = {a for _, a in evaluation_examples("parity", 12, 100, 1)}
    assert answers == {"0", "1"}


@pytest.mark.parametrize("reversed_", [False, True])
@pytest.mark.parametrize("hints", [False, True])
def test_addition_with_hints_and_reversed_answers_still_adds(hints, reversed_):
    settings = TaskSettings(hints=hints, reversed=reversed_)
    starts = set()
    for prompt, answer in training_examples("addition", range(1, 9), 300, 4, settings):
        numbers = []
        for text in (*prompt[:-1].split("+"), answer):
            letters, digits = text[0::2] if hints else "", text[1::2] if hints else text
            if hints:  # consecutive letters, rising from the least significant digit
                order = letters if reversed_ else letters[::-1]
                assert [ord(c) - ord(order[0]) for c in order] == list(range(len(order)))
                starts.add(order[0])
            numbers.append(int(digits[::-1] if reversed_ else digits))
        a, b, total = numbers
        assert a + b == total
    if hints:
        assert len(starts) > 10  # the hints start at a random letter: every one is trained
    # Plain addition draws what it always drew: the settings add, they do not reshuffle.
    plain = training_examples("addition", range(1, 9), 50, 4)
    if not hints and not reversed_:
        assert plain == training_examples("addition", range(1, 9), 50, 4, settings)


FITS = ["data.task_lengths=2-3", "data.task_eval_lengths=2-4"]


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            ["data.source=builtin:mqar", "data.task_lengths=0", "data.task_eval_lengths=2"],
            "data.task_lengths: 0 must go from a length >= 1",
        ),
        (
            ["data.source=builtin:mqar", "data.task_lengths=2", "data.task_eval_lengths=27"],
            "data.task_eval_lengths: mqar at length 27 needs that many distinct key-value pairs",
        ),
        (
            ["data.source=builtin:mqar", "data.task_lengths=2", "data.task_eval_lengths=5"],
            "data.task_eval_lengths: mqar at length 5 makes examples of 36 tokens with <eod>, "
            "more than model.context_length=32 + 1",
        ),
        (
            ["data.source=builtin:indexing", "data.task_lengths=1-3", "data.task_eval_lengths=3"],
            "data.task_lengths: indexing needs at least 2 letters",
        ),
        (
            ["data.source=builtin:copy", *FITS, "data.addition_hints=true"],
            "data.addition_hints: applies to data.source: builtin:addition only",
        ),
        (
            ["data.source=builtin:parity", *FITS, "data.addition_reversed=true"],
            "data.addition_reversed: applies to data.source: builtin:addition only",
        ),
        (
            [
                "data.source=builtin:addition",
                "data.addition_hints=true",
                "data.task_lengths=2",
                "data.task_eval_lengths=26",
                "model.context_length=400",
            ],
            "data.task_eval_lengths: addition at length 26 writes sums of 27 digits and "
            "data.addition_hints has 26 hints (a-z); at most 25",
        ),
        (
            [
                "data.source=builtin:addition",
                "data.task_lengths=2",
                "data.task_eval_lengths=2-5",
                "data.addition_hints=true",
            ],
            "data.task_eval_lengths: addition at length 5 makes examples of 35 tokens",
        ),
        (
            ["data.source=builtin:counting", *FITS, "data.counting_variables=4"],
            "data.counting_variables: 4 is not 1, 2 or 3",
        ),
        (
            ["data.source=builtin:counting", *FITS, "data.selective_copy_density=0.5"],
            "data.selective_copy_density: applies to data.source: builtin:selective_copy only",
        ),
        (
            ["data.source=builtin:selective_copy", *FITS, "data.selective_copy_density=0"],
            "data.selective_copy_density: must be in (0, 1]",
        ),
        (
            [
                "data.source=builtin:counting",
                "model.position=learned",
                "data.task_lengths=2",
                "data.task_eval_lengths=2-8",
            ],
            "data.task_eval_lengths: counting at length 8 makes examples of 51 tokens with "
            "<eod>, more than model.context_length=32 + 1",
        ),
        (
            ["data.source=builtin:parity", *FITS, "model.random_positions_eval=true"],
            "model.random_positions_eval: draws model.random_positions at evaluation too",
        ),
    ],
)
def test_bad_settings_of_the_new_tasks_are_one_line_and_exit_2(settings, message, tmp_path, capsys):
    config = write_config(tmp_path / "c.yaml", data={"cache_dir": str(tmp_path / "cache")})
    with pytest.raises(ConfigError) as e:
        load_config(config, settings)
    assert_one_line(e, message)
    argv = ["train", str(config), "--out", str(tmp_path / "run"), "--set", *settings]
    expect_error(capsys, argv, message)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_positions_drawn_at_evaluation_change_every_pass_and_decode_without_a_cache(monkeypatch):
    def model(eval_draws: bool) -> TransformerLM:
        model_settings = {
            "vocab_size": 16,
            "position": "learned",
            "random_positions": 64,
            "random_positions_eval": eval_draws,
        }
        torch.manual_seed(0)
        return TransformerLM(tiny_config(model=model_settings).model).eval()

    ids = torch.randint(0, 16, (2, 12))
    with torch.no_grad():
        plain, drawn = model(False), model(True)
        # Trained the same, read the same at 0..L-1 unless drawn: a learned table shows it.
        assert torch.equal(plain(ids), plain(ids))
        assert not torch.allclose(drawn(ids), drawn(ids))
        drawn.train()
        assert not torch.allclose(drawn(ids), drawn(ids))
        drawn.eval()

    def no_cache(*args, **kwargs):
        raise AssertionError("a KV cache would hold one draw's keys")

    monkeypatch.setattr(drawn, "new_cache", no_cache)
    with torch.no_grad():
        drawn.pos_embed.weight.mul_(50)  # the positions, not the last token, pick the next one
    out = generate(drawn, [[1, 2, 3], [4, 5]], 8, pad_id=0)
    assert [len(o) for o in out] == [8, 8]
    for seed in range(3):  # the draws come from the prompts (and a seed), not torch's stream
        torch.manual_seed(seed)
        assert generate(drawn, [[1, 2, 3], [4, 5]], 8, pad_id=0) == out
    monkeypatch.setattr(plain, "new_cache", no_cache)
    with pytest.raises(AssertionError, match="one draw"):
        generate(plain, [[1, 2, 3]], 2, pad_id=0)


def test_lm_eval_of_a_run_drawing_positions_at_evaluation_is_a_function_of_the_run(tmp_path):
    """Positions drawn at evaluation come from the run's seed, the split, the length and the
    batch: lm eval twice gives the same losses and accuracies, whatever torch's stream holds."""
    config = write_config(
        tmp_path / "parity.yaml",
        model={"position": "rope", "random_positions": 128, "random_positions_eval": True},
        data={
            "source": "builtin:parity",
            "mode": "padded",
            "cache_dir": str(tmp_path / "cache"),
            "task_lengths": "2-3",
            "task_eval_lengths": "2-4",
            "task_eval_examples": 24,
        },
        train={"max_steps": 40, "eval_every": 20, "checkpoint_every": 40},
    )
    run = tmp_path / "run"
    assert main(["train", str(config), "--out", str(run), "--quiet"]) == 0
    argv = ["eval", str(run), "--context-lengths", "1x,2x", "--max-batches", "8"]
    results = []
    for _ in range(2):
        torch.manual_seed(len(results))  # whatever torch's stream holds, the same numbers
        assert main(argv) == 0
        results.append(json.loads((run / "eval.json").read_text()))
    assert results[0]["rows"] == results[1]["rows"]
    assert results[0]["accuracy"] == results[1]["accuracy"]
    # Longer than model.random_positions (M = 4x): no draw of that many distinct positions.
    assert main(["eval", str(run), "--context-lengths", "5x", "--max-batches", "1"]) == 0
    row = json.loads((run / "eval.json").read_text())["rows"][0]
    assert row["loss"] is None and "draws 160 distinct positions from [0, 128)" in row["note"]
    # The validation the training logged is lm eval's at 1x, batch for batch.
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in logged if "val_loss" in r][-1]
    assert main(["eval", str(run), "--max-batches", "4"]) == 0
    assert json.loads((run / "eval.json").read_text())["rows"][0]["loss"] == pytest.approx(val)
    # lm view's data and lm plot's attention of a text: the same draw each time too.
    loaded = load_run(run)
    views = [prompt_view(loaded, "0110=", long=False) for _ in range(2)]
    assert views[0] == views[1]
    pictures = [draw_attention(run, "0110=", out=tmp_path / f"{i}.png") for i in range(2)]
    assert (pictures[0].weights == pictures[1].weights).all()


def test_a_tiny_counting_sweep_reports_accuracy_per_split_and_length(tmp_path, capsys):
    data = {
        "source": "builtin:counting",
        "mode": "padded",
        "task_lengths": "2-3",
        "task_eval_lengths": "2-5",
        "task_examples": 200,
        "task_eval_examples": 4,
        "counting_variables": 1,
    }
    config = write_config(
        tmp_path / "count.yaml",
        model={"context_length": 40},
        data=data,
        train={"max_steps": 3, "eval_every": 0, "checkpoint_every": 3},
    )
    out = tmp_path / "sweep"
    argv = ["compare", str(config), "--vary", "model.position=rope,none", "--seeds", "1"]
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    assert main([*argv, "--set", cache, "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    markdown = (out / "report.md").read_text()
    assert "## Exact-match accuracy by split" in markdown
    assert "Each run answers 4 counting prompts per split and length" in markdown
    assert "weight of pass against set 1 and increment 7: in-distribution 50, more pass 200" in (
        markdown
    )
    head = "| position | in-distribution @ 2–3 | in-distribution @ 4–5 | more pass @ 2–3 | "
    assert head + "more pass @ 4–5 |" in markdown
    runs = json.loads((out / "report.json").read_text())["runs"]
    rows = runs[0]["accuracy"]
    assert [(r["split"], r["length"], r["trained"]) for r in rows] == [
        ("in-distribution", 2, True),
        ("in-distribution", 3, True),
        ("in-distribution", 4, False),
        ("in-distribution", 5, False),
        ("more pass", 2, False),
        ("more pass", 3, False),
        ("more pass", 4, False),
        ("more pass", 5, False),
    ]
    assert all(r["examples"] == 4 and 0 <= r["correct"] <= 4 for r in rows)
    # lm eval on one of the runs prints the same rows, each split named.
    run = next(p for p in out.rglob("run.json")).parent
    assert main(["eval", str(run)]) == 0
    printed = capsys.readouterr().out
    assert "| split | length | exact match | correct | trained |" in printed
    assert "| more pass | 5 |" in printed and "| in-distribution | 2 |" in printed
    saved = json.loads((run / "eval.json").read_text())["accuracy"]
    assert [(r["split"], r["length"]) for r in saved] == [(r["split"], r["length"]) for r in rows]
