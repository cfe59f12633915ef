"""Choices left to ``auto`` are measured on the machine that runs them, once per shape, kept,
recorded in run.json, shown and forgotten by ``lm choices``."""

from __future__ import annotations

import json
import re

import pytest
import torch
from _support import tiny_config

import lm.training.tune as tune
from lm.cli import main
from lm.runtime import choices
from lm.training.loop import train


def fake_steps(seconds: dict[str, float], calls: list[str]):
    def step(name):
        def run():
            calls.append(name)
            return seconds[name]

        return run

    return {name: step(name) for name in seconds}


def test_a_choice_is_measured_once_per_shape_and_machine_then_read_back(monkeypatch):
    calls: list[str] = []
    steps = fake_steps({"fp32": 0.10, "bf16": 0.05}, calls)
    made = choices.choose("train.dtype", {"d_model": 64}, steps, tune._prefer)
    assert (made.value, made.how) == ("bf16", "measured")
    assert made.ms_per_step == {"fp32": 100.0, "bf16": 50.0}
    assert calls == ["fp32", "bf16"] * 4  # a warm-up, then three rounds in turn
    # The same shape on the same machine: read back, nothing timed.
    again = choices.choose("train.dtype", {"d_model": 64}, steps, tune._prefer)
    assert (again.value, again.how, len(calls)) == ("bf16", "cached", 8)
    # Another shape, another CPU or another torch is measured anew.
    choices.choose("train.dtype", {"d_model": 128}, steps, tune._prefer)
    assert len(calls) == 16
    monkeypatch.setattr(choices, "cpu_name", lambda: "Intel(R) Xeon(R) Platinum 8488C")
    choices.choose("train.dtype", {"d_model": 64}, steps, tune._prefer)
    assert len(calls) == 24
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    choices.choose("train.dtype", {"d_model": 64}, steps, tune._prefer)
    assert len(calls) == 32
    kept = choices.read()
    assert len(kept) == 4 and all(json.loads(k)["kind"] == "train.dtype" for k in kept)


def test_bf16_is_kept_only_where_clearly_faster():
    assert tune._prefer({"fp32": 100.0, "bf16": 95.0}) == "bf16"
    assert tune._prefer({"fp32": 100.0, "bf16": 96.0}) == "fp32"  # within noise: the exact one
    assert tune._prefer({"fp32": 100.0, "bf16": 300.0}) == "fp32"


def test_a_damaged_cache_counts_as_empty_and_is_rewritten():
    choices.cache_file().parent.mkdir(parents=True, exist_ok=True)
    choices.cache_file().write_bytes(b"\xff not json")
    assert choices.read() == {}
    steps = fake_steps({"fp32": 0.01, "bf16": 0.02}, [])
    assert choices.choose("k", {}, steps, tune._prefer).value == "fp32"
    assert len(choices.read()) == 1


def auto_config(**train):
    return tiny_config(train={"dtype": "auto", "max_steps": 2, "eval_every": 0, **train})


@pytest.fixture
def measuring(monkeypatch):
    """Measuring on, on a CPU that has bf16 instructions (whatever this one has)."""
    monkeypatch.setenv("LM_TUNE", "on")
    monkeypatch.setattr(tune, "cpu_bf16_kind", lambda: "avx512_bf16")


def ran(run_dir, sitting=-1):
    record = json.loads((run_dir / "run.json").read_text())
    return [record["ran"], *(r["ran"] for r in record.get("resumes", []))][sitting]


def test_a_run_left_to_auto_records_what_was_measured_and_the_next_reads_it(
    tmp_path, measuring, capsys
):
    train(auto_config(), tmp_path / "a")
    first = ran(tmp_path / "a")
    choice = first["dtype_choice"]
    assert choice["how"] == "measured" and set(choice["ms_per_step"]) == {"fp32", "bf16"}
    assert first["dtype"] == {"fp32": "float32", "bf16": "bfloat16"}[choice["value"]]
    assert choice["cache"] == str(choices.cache_file())
    assert "measured now on this machine" in capsys.readouterr().err
    train(auto_config(), tmp_path / "b")
    second = ran(tmp_path / "b")["dtype_choice"]
    assert second["how"] == "cached" and second["value"] == choice["value"]
    assert "measured earlier on this machine" in capsys.readouterr().err
    # Measuring leaves the random generators as they were: the same numbers as a fixed dtype.
    fixed = {"float32": "fp32", "bfloat16": "bf16"}[first["dtype"]]
    train(auto_config(dtype=fixed), tmp_path / "c")
    losses = [
        [json.loads(line).get("train_loss") for line in (tmp_path / r / "metrics.jsonl").open()]
        for r in "ac"
    ]
    assert losses[0] == losses[1] and any(loss is not None for loss in losses[0])


def test_a_resume_keeps_the_dtype_it_trained_with(tmp_path, measuring, monkeypatch):
    monkeypatch.setattr(tune, "_prefer", lambda ms: "bf16")
    train(auto_config(max_steps=2, checkpoint_every=1), tmp_path / "run")
    assert ran(tmp_path / "run")["dtype"] == "bfloat16"
    choices.clear()
    monkeypatch.setattr(tune, "_prefer", lambda ms: "fp32")  # this machine would now say fp32
    train(auto_config(max_steps=4, checkpoint_every=1), tmp_path / "run", resume=True)
    resumed = ran(tmp_path / "run")
    assert resumed["dtype"] == "bfloat16" and resumed["dtype_choice"]["how"] == "resumed"


def test_without_measuring_auto_says_why(tmp_path):
    train(auto_config(), tmp_path / "run")  # the suite runs with LM_TUNE=off
    choice = ran(tmp_path / "run")["dtype_choice"]
    assert choice["how"] == "fallback" and choice["why"] in (
        "LM_TUNE=off",
        "no bf16 instructions on this CPU: fp32",
    )
    assert not choices.cache_file().exists()


def test_lm_choices_shows_the_cache_and_forgets_it(capsys):
    steps = fake_steps({"fp32": 0.01, "bf16": 0.02}, [])
    choices.choose("train.dtype", {"model": {"d_model": 64}, "threads": 2}, steps, tune._prefer)
    assert main(["choices"]) == 0
    out = capsys.readouterr()
    assert f"1 measured choice(s) in {choices.cache_file()}" in out.err
    assert "train.dtype: fp32 (fp32 10 ms, bf16 20 ms;" in out.out and "d_model=64" in out.out
    assert main(["choices", "--clear"]) == 0
    assert "forgot 1 measured choice(s)" in capsys.readouterr().err
    assert choices.read() == {}


def test_jobs_auto_takes_a_job_per_core_only_where_side_by_side_pays(monkeypatch):
    import lm.compare.side_by_side as sbs

    cfg = tiny_config(model={"vocab_size": 40})
    device = torch.device("cpu")
    # Measuring off (the suite), or one core: one job, saying why.
    assert sbs.auto_jobs(cfg, device, 2)[0] == 1
    assert sbs.auto_jobs(cfg, device, 2)[1].why == "LM_TUNE=off"
    monkeypatch.setenv("LM_TUNE", "on")
    assert sbs.auto_jobs(cfg, device, 1)[1].why == "one thread to divide"
    # Measured: two one-thread runs at once against one run on both cores.
    timings = {"one": 0.020, "together": 0.015}
    monkeypatch.setattr(sbs, "_one", lambda m, micro, cores: timings["one"])
    monkeypatch.setattr(sbs, "_together", lambda m, micro, cores: timings["together"])
    n, choice = sbs.auto_jobs(cfg, device, 2)
    assert (n, choice.how, choice.ms_per_step) == (2, "measured", {"1": 20.0, "2": 15.0})
    timings["together"] = 0.019  # a gain within drift no longer pays; but the answer is kept
    assert sbs.auto_jobs(cfg, device, 2)[1].how == "cached"
    choices.clear()
    assert sbs.auto_jobs(cfg, device, 2)[0] == 1
    wider = tiny_config(model={"vocab_size": 40, "d_model": 64})
    timings["together"] = 0.010
    assert sbs.auto_jobs(wider, device, 2)[1].how == "measured"  # another shape, measured anew


def test_lm_compare_jobs_auto_says_what_it_decided(tmp_path, capsys):
    from _support import write_config

    cfg = write_config(tmp_path / "tiny.yaml", train={"max_steps": 2, "eval_every": 0})
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    argv = ["compare", str(cfg), "--vary", "model.position=rope,none", "--set", cache]
    assert main([*argv, "--jobs", "auto", "--out", str(tmp_path / "s")]) == 0
    err = capsys.readouterr().err  # a test worker has one thread: either reason says 1
    assert re.search(r"compare: --jobs auto: 1 \((LM_TUNE=off|one thread to divide)\)", err)
    with pytest.raises(SystemExit):
        main([*argv, "--jobs", "some", "--out", str(tmp_path / "t")])
    assert "'some' is not a count of 1 or more, nor auto" in capsys.readouterr().err
