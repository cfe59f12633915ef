"""lm bench (lm/benchmark/): the battery's runs end to end on a tiny budget, resumed; ranks and
verdicts from a hand-made reference; bad input in one line; a scheme from outside; card.html in
headless Chromium; and two builtins rerun to their stored quick references."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _support import Pauses, expect_error

import lm
from lm.benchmark import battery
from lm.benchmark.card import make_card, markdown, read_references, verdict
from lm.benchmark.page import card_html
from lm.benchmark.run import default_out, plan, run_battery, summary
from lm.cli import main
from lm.config.errors import LMError
from lm.runs.checkpoint import latest_checkpoint, read_state

ROOT = Path(__file__).resolve().parents[1]
BY_NAME = {b.name: b for b in battery.BATTERY}
TINY = (
    dataclasses.replace(
        BY_NAME["length curve"],
        quick=("train.batch_size=4", "train.max_steps=3", "model.n_layer=1", "model.d_model=32"),
        lengths=("1x", "2x"),
        quick_batches=1,
    ),
    dataclasses.replace(
        BY_NAME["passkey"],
        quick=(
            "train.batch_size=4",
            "train.max_steps=2",
            "data.task_examples=100",
            "data.task_eval_examples=2",
            "data.passkey_lengths=1x,2x",
        ),
    ),
)
"""A battery of seconds: the length curve and passkey (two scores, one k_max) at a test's budget."""


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(battery, "BATTERY", TINY)
    return TINY


def test_the_cli_writes_the_card_and_a_rerun_reuses_every_run(tiny, tmp_path, capsys):
    out = tmp_path / "card"
    assert main(["bench", "--position", "alibi", "--quick", "--out", str(out)]) == 0
    first = capsys.readouterr()
    card = json.loads((out / "card.json").read_text())
    assert card["version"] == 1 and card["scheme"] == "alibi" and card["battery"] == "quick"
    assert [r["id"] for r in card["scores"]] == [
        "length curve: loss 2x-8x",
        "passkey: mean accuracy",
        "passkey: k_max",
    ]
    assert card["curve"]["lengths"] == ["1x", "2x"]
    assert (out / "card.md").read_text().startswith("<!-- lm bench card -->")
    assert "<svg" in (out / "card.html").read_text()
    assert "| length curve | loss 2x-8x (lower is better) |" in first.out  # the table, on stdout
    progress = [line for line in first.err.splitlines() if line.startswith("bench: ")]
    assert len(progress) == 3  # a line per run, then where the card went
    # Again: no run trains, every measurement is read back, the same card.
    assert main(["bench", "--position", "alibi", "--quick", "--out", str(out)]) == 0
    again = capsys.readouterr()
    assert again.err.count("reusing it") == 2 and "compare: training" not in again.err
    assert json.loads((out / "card.json").read_text()) == card


def test_ctrl_c_mid_battery_says_so_in_one_line_and_the_same_command_resumes(tmp_path):
    """The whole quick battery at a tiny budget (--set), in its own process: Ctrl-C while the
    second benchmark trains, then the same command again."""
    out = tmp_path / "card"
    tiny = ["train.max_steps=8", "train.batch_size=4", "train.log_every=1"]
    tiny += ["model.n_layer=1", "model.d_model=32", "model.n_head=2"]
    command = [sys.executable, "-m", "lm", "bench", "--position", "rope", "--quick"]
    command += ["--out", str(out), "--set", *tiny]
    # Its runs train one after another in this one process: the first run (the length curve)
    # passes step 3, the second (flip-flop) stops there and says so; Ctrl-C comes then.
    pauses = Pauses(
        tmp_path, [{"where": "step", "at": 3, "passes": 1, "tell": "{fifo}", "then": "signal"}]
    )
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=pauses.env())
    told = pauses.wait(1, ended=process)
    assert told is not None, process.stderr.read()
    pauses.close()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 130, err
    stopped, finished = out / "flip-flop" / "seed1", out / "length-curve" / "seed1"
    step = read_state(latest_checkpoint(stopped))["step"]
    assert 3 < step < 8  # stopped mid-run, with a checkpoint
    assert err.strip().splitlines()[-1] == (
        f"lm: interrupted; {stopped} saved a checkpoint at step {step}; the same command again "
        "resumes"
    ), err
    assert "Traceback" not in err and not (out / "counting").exists(), err
    assert read_state(latest_checkpoint(finished))["step"] == 8
    kept = _files(finished)
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    # Nothing finished is trained again; the interrupted run goes on from its checkpoint to the
    # end, one curve; the card holds every benchmark.
    assert f"compare: {finished} is finished (step 8); reusing it" in again.stderr
    assert f"compare: resuming {stopped} from step {step}" in again.stderr
    assert _files(finished) == kept
    assert read_state(latest_checkpoint(stopped))["step"] == 8
    lines = (stopped / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if '"train_loss"' in line]
    assert steps == sorted(set(steps)) and steps[-1] == 8
    card = json.loads((out / "card.json").read_text())
    assert [r["benchmark"] for r in card["scores"]] == [b.name for b in battery.benchmarks("quick")]
    assert all(r["values"][0] is not None for r in card["scores"])
    assert "| parity |" in again.stdout


def _files(run: Path) -> dict[str, str]:
    """The sha256 of each file of a run's checkpoints: its weights and state."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.glob("checkpoints/*/*"))
        if p.is_file()
    }


def _stat(*values):
    import statistics

    return {
        "values": list(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
    }


def _reference(scores: dict[str, dict[str, tuple]]) -> dict:
    """References of the tiny battery: per scheme, each score's per-seed values."""
    from lm.benchmark.card import battery_settings

    schemes = {
        name: {
            "scores": {key: _stat(*values) for key, values in by_key.items()},
            "curve": {"1x": _stat(1.5), "2x": _stat(1.7)},
            "machine": "a test",
        }
        for name, by_key in scores.items()
    }
    return {
        "version": 1,
        "batteries": {"quick": {"settings": battery_settings("quick"), "schemes": schemes}},
    }


def test_ranks_bests_and_verdicts_follow_from_the_references(tiny):
    loss, acc = "length curve: loss 2x-8x", "passkey: mean accuracy"
    references = _reference(
        {
            "rope": {
                loss: (2.0, 2.2, 2.1),
                acc: (0.5, 0.6, 0.7),
                "passkey: k_max": (128, 128, 256),
            },
            "alibi": {loss: (1.7, 1.71, 1.72), acc: (0.9, 0.95, 1.0), "passkey: k_max": (512,) * 3},
            "none": {loss: (2.5, 2.5, 2.5), acc: (0.1, 0.1, 0.1), "passkey: k_max": (0, 0, 0)},
        }
    )
    mine = {
        "scores": {
            loss: _stat(1.9, 1.95, 2.0),  # lower than RoPE's 2.1 by 0.15 > its std 0.1
            acc: _stat(0.6, 0.65, 0.7),  # RoPE's 0.6 ± 0.1: better by 0.05, within 0.1
            "passkey: k_max": _stat(512, 512, 512),  # level with ALiBi's
        },
        "curve": {"1x": _stat(1.4, 1.4, 1.4), "2x": _stat(1.9, 1.95, 2.0)},
    }
    card = make_card("mine.py:Mine", "quick", [], mine, references)
    rows = {r["id"]: r for r in card["scores"]}
    assert (rows[loss]["rank"], rows[loss]["of"]) == (2, 4)  # behind ALiBi only
    assert rows[loss]["best"]["scheme"] == "alibi"
    assert rows[loss]["against_rope"]["verdict"] == "better"
    assert rows[loss]["against_rope"]["beyond_spread"] is True
    assert rows[loss]["against_best"]["said"] == "worse, beyond the spread"
    assert rows[acc]["against_rope"]["said"] == "better, within the spread"
    assert rows[acc]["rank"] == 2
    assert rows["passkey: k_max"]["against_best"]["said"] == "level"
    assert rows["passkey: k_max"]["rank"] == 1  # level with the best shares its rank
    assert "hold 3 of 18 builtins" in card["references"]["notes"][0]
    assert "| passkey | k_max (higher is better) | 512 ± 0 | 1 of 4 | alibi 512 ± 0 |" in (
        markdown(card)
    )
    # A builtin is ranked among the others, and one seed has no spread.
    one = {"values": [2.0], "mean": 2.0, "std": None}
    said = verdict(
        one, references["batteries"]["quick"]["schemes"]["rope"]["scores"][loss], tiny[0].scores[0]
    )
    assert said["said"] == "better (1 seed: no spread)" and said["beyond_spread"] is None
    card = make_card(
        "rope", "quick", [], {**mine, "scores": {loss: _stat(2.1, 2.1, 2.1)}}, references
    )
    assert (card["scores"][0]["rank"], card["scores"][0]["of"]) == (2, 3)


def test_p_rope_is_a_builtin_row_and_benched_is_ranked_among_the_others(tiny):
    loss = "length curve: loss 2x-8x"
    assert battery.BUILTINS["p-rope"] == ("rope", ("model.rope_p=0.25",))
    assert len(battery.BUILTINS) == 18 and battery.builtin_of("rope", []) == "rope"
    assert battery.builtin_of("rope", ["model.rope_p=0.25"]) == "p-rope"
    assert battery.builtin_of("rope", ["model.rope_p=0.5"]) is None
    assert default_out("rope", "quick", ["model.rope_p=0.25"]) == Path("runs/bench/p-rope-quick")
    assert default_out("mine.py:Mine", "full", []) == Path("runs/bench/Mine")
    references = _reference(
        {
            "rope": {loss: (2.0, 2.2, 2.1)},
            "p-rope": {loss: (1.8, 1.8, 1.8)},
            "alibi": {loss: (1.9,) * 3},
        }
    )
    mine = {"scores": {loss: _stat(1.85, 1.85, 1.85)}, "curve": {}}
    card = make_card("rope", "quick", ["model.rope_p=0.25"], mine, references)
    row = card["scores"][0]
    assert (row["rank"], row["of"]) == (1, 3)  # among RoPE and ALiBi, not against its own row
    assert card["references"]["schemes"] == ["rope", "alibi", "p-rope"]
    assert not any("--set" in note for note in card["references"]["notes"])
    # Any other --set is not a builtin's: ranked among all of them, and said.
    card = make_card("rope", "quick", ["model.rope_p=0.5"], mine, references)
    assert (card["scores"][0]["rank"], card["scores"][0]["of"]) == (2, 4)  # behind p-rope
    assert "--set model.rope_p=0.5" in markdown(card)


def test_a_missing_or_stale_reference_is_said_and_gives_no_verdict(tiny):
    mine = {"scores": {"passkey: k_max": _stat(64)}, "curve": {}}
    card = make_card("rope", "full", [], mine, {"version": 1, "batteries": {}})
    assert card["scores"][0]["rank"] is None and card["scores"][0]["against_rope"] is None
    assert card["references"]["notes"] == [
        "no full reference exists yet (python scripts/bench_references.py makes them): no "
        "ranks, no verdicts"
    ]
    stale = _reference({"rope": {"passkey: k_max": (64,)}})
    stale["batteries"]["quick"]["settings"]["passkey"]["settings"].append("train.lr=1")
    card = make_card("rope", "quick", [], mine, stale)
    assert "made with other battery settings" in card["references"]["notes"][0]
    assert card["scores"][0]["best"] is None


def test_bad_input_is_one_line_and_exit_2(tiny, tmp_path, capsys):
    expect_error(capsys, ["bench", "--position", "nope", "--quick"], "model.position", "nope")
    expect_error(capsys, ["bench", "--position", "rope", "--set", "model.nosuch=1"], "model.nosuch")
    expect_error(capsys, ["bench", "--position", "rope", "--set", "train.seed=4"], "train.seed")
    missing = ["bench", "--position", "examples/none.py:Mine"]
    expect_error(capsys, missing, "examples/none.py")
    a_file = tmp_path / "a file"
    a_file.write_text("mine")
    expect_error(capsys, ["bench", "--position", "rope", "--out", str(a_file / "x")], "a file")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "card.md").write_text("my own notes\n")
    expect_error(capsys, ["bench", "--position", "rope", "--out", str(theirs)], "card.md")
    assert (theirs / "card.md").read_text() == "my own notes\n"
    assert list(theirs.iterdir()) == [theirs / "card.md"]  # nothing trained
    # The Python API raises the same lines.
    with pytest.raises(LMError, match="jobs: 0 is not"):
        lm.bench("rope", jobs=0)
    with pytest.raises(LMError, match=r"train\.seed"):
        lm.bench("rope", overrides="train.seed=2", quick=True)


def test_a_scheme_from_outside_is_benched_from_its_file(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the spec is relative to the working directory
    monkeypatch.setattr(battery, "BATTERY", TINY[1:])
    out = tmp_path / "outside"
    spec = "examples/alibi_learned_slopes.py:LearnedSlopes"
    assert main(["bench", "--position", spec, "--quick", "--out", str(out)]) == 0
    card = json.loads((out / "card.json").read_text())
    assert card["scheme"] == spec and card["scores"][0]["values"][0] is not None
    recorded = json.loads((out / "passkey" / "seed1" / "run.json").read_text())
    assert recorded["schemes"][0]["spec"].endswith("alibi_learned_slopes.py:LearnedSlopes")


def test_card_html_draws_the_curve_and_bars_in_chromium(tiny, tmp_path):
    test_view = pytest.importorskip("test_view")
    if not test_view.CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium) for the browser test")
    playwright = pytest.importorskip("playwright.sync_api")
    loss, acc = "length curve: loss 2x-8x", "passkey: mean accuracy"
    references = _reference(
        {
            "rope": {loss: (2.0, 2.2, 2.1), acc: (0.5, 0.6, 0.7)},
            "alibi": {loss: (1.7, 1.71, 1.72), acc: (0.9, 0.95, 1.0)},
        }
    )
    mine = {
        "scores": {loss: _stat(1.9, 1.95, 2.0), acc: _stat(0.2, 0.25, 0.3)},
        "curve": {"1x": _stat(1.4, 1.5, 1.6), "2x": _stat(1.9, 1.95, 2.0)},
    }
    path = tmp_path / "card.html"
    path.write_text(card_html(make_card("mine.py:Mine", "quick", [], mine, references)))
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(test_view.CHROMIUM), args=test_view.CHROMIUM_ARGS
        )
        page = chromium.new_page(viewport={"width": 1200, "height": 900})
        errors, requests = [], []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.goto(path.as_uri())
        lines = page.eval_on_selector_all(
            "#curve-plot path.line", "els => els.map(e => [e.classList[1], e.getAttribute('d')])"
        )
        bars = page.eval_on_selector_all(
            "rect.bar", "els => els.map(e => [e.classList[1], e.getBBox().width])"
        )
        page.screenshot(path=str(tmp_path / "card.png"), full_page=True)
        chromium.close()
    assert errors == [] and requests == [path.as_uri()]
    assert sorted(kind for kind, _ in lines) == ["best", "rope", "scheme"]
    scheme_line = next(d for kind, d in lines if kind == "scheme")
    assert scheme_line.count("L") == 1  # two lengths: a segment
    widths = dict(bars[-3:])  # the accuracy chart: ALiBi 0.95, RoPE 0.6, the scheme 0.25
    assert widths["scheme"] < widths["rope"]
    assert widths["scheme"] / widths["rope"] == pytest.approx(0.25 / 0.6, rel=0.02)


def test_two_builtins_rerun_to_their_stored_quick_references(tmp_path):
    """RoPE's and ALiBi's parity run of the quick battery, rerun, give the stored numbers:
    fp32 and SDPA are pinned, so on the machine kind that made them the numbers are equal."""
    made = read_references()["batteries"].get("quick", {}).get("schemes", {})
    assert {"rope", "alibi"} <= set(made), "the quick references are missing"
    machine = next(iter(made.values()))["machine"].split(", bf16")[0]
    here = _cpu_model()
    if here != machine:
        pytest.skip(f"the references were made on {machine}; this is {here}: another kind")
    parity = (BY_NAME["parity"],)
    for scheme in ("rope", "alibi"):
        planned = plan(scheme, [], "quick", tmp_path / scheme, parity)
        runs = run_battery(planned, "quick", log=lambda line: None, quiet=True)
        got = summary(runs)["scores"]["parity: 9-16 bits"]["values"]
        assert got == made[scheme]["scores"]["parity: 9-16 bits"]["values"], scheme


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor()
