"""Choices left to ``auto`` are measured on the machine that runs them, once per shape, kept,
recorded in run.json, shown and forgotten by ``lm choices``."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
import types

import pytest
import torch
from _support import tiny_config

import lm.training.tune as tune
from lm.cli import main
from lm.runtime import choices
from lm.runtime.choices import cpu_seconds
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


def test_a_measurement_beside_other_work_is_used_but_not_kept(monkeypatch):
    monkeypatch.setattr(choices, "cpu_seconds", cpu_seconds)  # watched, as outside the suite
    if cpu_seconds() is None:
        pytest.skip("no /proc/stat: nothing is watched on this system")

    def idle():  # a candidate that leaves the CPUs to whatever else runs
        time.sleep(0.1)
        return 0.1

    spin = "print('spinning', flush=True)\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout.readline() == "spinning\n"  # it is busy before the measurement
        made = choices.choose("train.dtype", {}, {"fp32": idle, "bf16": idle}, tune._prefer)
    finally:
        spinner.kill()
        spinner.wait()
    assert made.how == "measured" and made.value == "fp32"
    assert re.fullmatch(
        r"other work kept \d+\.\d of this machine's \d+ CPUs busy while it ran", made.not_kept
    )
    assert made.record()["not_kept"] == made.not_kept and "cache" not in made.record()
    assert choices.read() == {}  # the next run measures again


def test_the_watch_counts_only_work_beyond_the_cpus_a_measurement_leaves_free(monkeypatch):
    now = {"busy": 100.0, "wall": 10.0}  # the machine's busy CPU-seconds, the clock
    monkeypatch.setattr(choices, "cpu_seconds", lambda: (now["busy"], 4))
    monkeypatch.setattr(choices, "own_cpu_seconds", lambda: 0.0)
    monkeypatch.setattr(choices, "time", types.SimpleNamespace(perf_counter=lambda: now["wall"]))
    watch = choices.OtherWork()
    now.update(busy=101.2, wall=11.0)  # a second in which other work took 1.2 CPU-seconds
    assert watch.cpus() == pytest.approx((1.2, 4))
    # Measuring on 2 of 4 CPUs leaves 2 free for it; on all 4, 1.2 CPUs of it is too much.
    assert watch.disturbed(2) == ""
    assert watch.disturbed(None) == "other work kept 1.2 of this machine's 4 CPUs busy while it ran"
    now.update(busy=101.4, wall=12.0)  # quieter since: 1.4 CPU-seconds in two seconds
    assert watch.disturbed(None) == "other work kept 0.7 of this machine's 4 CPUs busy while it ran"
    now.update(busy=101.5, wall=17.0)
    assert watch.disturbed(None) == ""  # 0.21 CPUs on average: within the slack


def test_bf16_is_kept_only_where_clearly_faster():
    assert tune._prefer({"fp32": 100.0, "bf16": 95.0}) == "bf16"
    assert tune._prefer({"fp32": 100.0, "bf16": 96.0}) == "fp32"  # within noise: the exact one
    assert tune._prefer({"fp32": 100.0, "bf16": 300.0}) == "fp32"


def test_a_damaged_cache_counts_as_empty_and_is_rewritten():
    choices.cache_file().parent.mkdir(parents=True, exist_ok=True)
    choices.cache_file().write_bytes(b"\xff not json")
    assert choices.read() == {}
    steps = fake_steps({"fp32": 0.01, "bf16": 0.02}, [])
    assert choices.choose("train.dtype", {}, steps, tune._prefer).value == "fp32"
    assert len(choices.read()) == 1


def auto_config(**train):
    """The dtype left to auto, the kernel named (``kernel_auto`` below leaves that to it)."""
    return tiny_config(
        model={"kernel": "sdpa"}, train={"dtype": "auto", "max_steps": 2, "eval_every": 0, **train}
    )


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


@pytest.mark.parametrize("left", ["train.dtype", "model.kernel", "both"])
def test_a_run_that_measured_beside_other_work_takes_the_default_says_so_and_keeps_nothing(
    left, tmp_path, measuring, monkeypatch, capsys
):
    from lm.config.load import load_config

    readings = iter(range(0, 10**6, 1000))  # every CPU busy all the time, none of it this run
    monkeypatch.setattr(choices, "cpu_seconds", lambda: (float(next(readings)), 2))
    monkeypatch.setattr(tune, "_prefer", lambda ms: "bf16")  # what the noise would choose
    monkeypatch.setattr(tune, "_prefer_kernel", lambda ms: "math")
    config = {"train.dtype": auto_config(), "model.kernel": kernel_auto()}.get(left)
    config = config or kernel_auto(dtype="auto")
    free = {"train.dtype": ["dtype_choice"], "model.kernel": ["kernel_choice"]}.get(left)
    for run in "ab":  # one command, one result: the portable default both times
        train(config, tmp_path / run)
        record = ran(tmp_path / run)
        assert (record["dtype"], record["kernel"]) == ("float32", "sdpa")
        assert load_config(tmp_path / run / "config.yaml").model.kernel == "sdpa"
        said = [record[k] for k in free or ["dtype_choice", "kernel_choice"]]
        assert all(c["how"] == "fallback" for c in said)
        assert all("other work kept" in c["not_kept"] and "the default" in c["why"] for c in said)
        assert all("cache" not in c for c in said) and not choices.cache_file().exists()
        err = capsys.readouterr().err
        assert "the default: measured beside other work (" in err and "other work kept" in err
        assert "the next run measures again" in err
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_a_disturbed_measurement_gives_way_to_the_default_only_where_named(monkeypatch):
    readings = iter(range(0, 10**6, 1000))
    monkeypatch.setattr(choices, "cpu_seconds", lambda: (float(next(readings)), 2))
    steps = fake_steps({"fp32": 0.10, "bf16": 0.05}, [])
    made = choices.choose("train.dtype", {}, steps, tune._prefer, default="fp32")
    assert (made.value, made.how, made.ms_per_step["bf16"]) == ("fp32", "fallback", 50.0)
    assert made.not_kept and made.record()["why"].startswith("the default: measured beside")
    # --jobs auto names none: how many jobs changes how fast a sweep trains, not its numbers.
    used = choices.choose("train.dtype", {}, steps, tune._prefer)
    assert (used.value, used.how) == ("bf16", "measured") and used.not_kept
    assert choices.read() == {}


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


def test_jobs_auto_takes_a_job_per_core_only_where_the_whole_sweep_gains(monkeypatch):
    import lm.compare.auto_jobs as sbs

    cfg = tiny_config(model={"vocab_size": 40})
    device = torch.device("cpu")
    # Measuring off (the suite), one core or one run: one job, saying why.
    assert sbs.auto_jobs(cfg, device, 2)[0] == 1
    assert sbs.auto_jobs(cfg, device, 2)[1].why == "LM_TUNE=off"
    monkeypatch.setenv("LM_TUNE", "on")
    assert sbs.auto_jobs(cfg, device, 1)[1].why == "one thread to divide"
    assert sbs.auto_jobs(cfg, device, 2, runs=1)[1].why == "one run to train"
    # Measured: a step of one run on both cores, of two one-thread runs at once, a job's start.
    timings = {"one": 0.020, "together": 0.015, "start": 1.0}
    monkeypatch.setattr(sbs, "_one", lambda m, t, micro, cores: (timings["one"], None))
    monkeypatch.setattr(
        sbs, "_together", lambda m, t, micro, cores: (timings["together"], timings["start"])
    )
    monkeypatch.setattr(sbs, "_probe", lambda m, t, micro, cores: (timings["one"], 0.03))
    # 4 runs of 1000 steps: 80 s one at a time; a job's start (1 s, once: a worker trains one
    # run after another), then two rounds of 1000 steps of 2 x 15 ms = 61 s.
    n, choice = sbs.auto_jobs(cfg, device, 2, runs=4, steps=1000)
    assert (n, choice.how) == (2, "measured")
    assert choice.ms_per_step == {"1": 20.0, "2": 15.0, "start": 1000.0}
    assert choice.why == "4 runs of 1000 steps: about 61 s 2 at a time, 80 s one at a time"
    # The same shape read back, for 3 short runs: 6 s one at a time; (100 x 2 x 15 ms + 1 s)
    # for the first two, then the third alone on both cores in lm compare's process (2 s): 6 s,
    # within drift. One job.
    n, choice = sbs.auto_jobs(cfg, device, 2, runs=3, steps=100)
    assert (n, choice.how, choice.value) == (1, "cached", "1")
    assert sbs.predict(choice.ms_per_step, 2, 3, 100) == pytest.approx((6.0, 6.0))
    # 3 cores, 5 runs: a job's start and a round of three (1 s + 100 x 3 x 15 ms), then the
    # last two share the three cores: one on two threads (1.625 times one thread's speed, half
    # way to every core's 2.25) until it ends, then the other alone on all three.
    three = {"1": 20.0, "3": 15.0, "start": 1000.0}
    first = 4.5 / 1.625
    expected = 5.5 + first + (4.5 - first) / 2.25
    assert sbs.predict(three, 3, 5, 100) == pytest.approx((10.0, expected))
    # A gain per step within drift does not pay: 80 s against 2 x (38 s + 1 s).
    choices.clear()
    timings["together"] = 0.019
    assert sbs.auto_jobs(cfg, device, 2, runs=4, steps=1000)[0] == 1
    wider = tiny_config(model={"vocab_size": 40, "d_model": 64})
    timings["together"] = 0.010
    assert sbs.auto_jobs(wider, device, 2, runs=4, steps=1000)[1].how == "measured"  # new shape


def test_jobs_auto_plays_a_sweep_as_the_jobs_train_it():
    from lm.compare.auto_jobs import predict

    # Every core makes a run twice as fast as one thread; no start, to see the rest.
    ms = {"1": 10.0, "2": 10.0}
    # Two runs, one twice the other (4 s and 2 s on one thread): once the short one ends, the
    # long one takes its core and its last 2 s take 1 s. Side by side is no faster here.
    assert predict(ms, 2, 2, 100, [2.0, 1.0]) == pytest.approx((3.0, 3.0))
    # The costliest first, whatever the order given: 6 s on one core beside three of 2 s.
    assert predict(ms, 2, 4, 100, [1.0, 1.0, 1.0, 3.0]) == pytest.approx((6.0, 6.0))
    # A job's start is paid once, however many runs a worker trains after it.
    start = {**ms, "start": 500.0}
    assert predict(start, 2, 4, 100, [1.0] * 4)[1] == pytest.approx(0.5 + 4.0)


def test_jobs_auto_times_rows_as_wide_as_the_sweeps_batches(monkeypatch):
    import lm.compare.auto_jobs as sbs

    monkeypatch.setenv("LM_TUNE", "on")
    cfg, cpu = tiny_config(model={"vocab_size": 40}), torch.device("cpu")
    timed = []

    def one(model, train, batch, cores):
        timed.append(batch)
        return 0.02, None

    def together(model, train, batch, cores):
        timed.append(batch)
        return 0.01, 1.0

    monkeypatch.setattr(sbs, "_one", one)
    monkeypatch.setattr(sbs, "_together", together)
    monkeypatch.setattr(sbs, "_probe", lambda m, t, batch, cores: (0.02, 0.02))
    micro = cfg.train.batch_size
    sbs.auto_jobs(cfg, cpu, 2, runs=4, steps=1000, width=5)  # a padded sweep's rows
    assert timed == [(micro, 5), (micro, 5)]
    assert sbs.auto_jobs(cfg, cpu, 2, runs=4, steps=1000, width=5)[1].how == "cached"
    sbs.auto_jobs(cfg, cpu, 2, runs=4, steps=1000)  # packed: the context, another measurement
    assert timed[2:] == [(micro, cfg.model.context_length)] * 2
    # The timed step itself is that wide.
    widths = []

    def training_step(model, rows, train, width):
        widths.append((rows, width))
        return lambda: None

    monkeypatch.setattr(sbs, "training_step", training_step)
    monkeypatch.setattr(sbs, "WINDOW_S", 0.0)
    sbs._steps(cfg.model, cfg.train, (micro, 5), 1)
    assert widths == [(micro, 5)]


def test_a_sweeps_runs_are_not_measured_and_their_records_say_why(tmp_path):
    from _support import write_config

    train_keys = {"max_steps": 2, "eval_every": 0, "dtype": "auto"}
    cfg = write_config(tmp_path / "tiny.yaml", model={"kernel": "auto"}, train=train_keys)
    argv = ["compare", str(cfg), "--vary", "model.position=rope,none", "--out", str(tmp_path / "s")]
    assert main([*argv, "--set", f"data.cache_dir={tmp_path / 'cache'}", "--jobs", "1"]) == 0
    record = ran(tmp_path / "s" / "position=rope" / "seed7")
    why = "a run of lm compare, which trains the same numbers one at a time or side by side"
    assert (record["kernel_choice"]["how"], record["kernel_choice"]["why"]) == ("fallback", why)
    assert record["dtype_choice"]["why"] in (why, "no bf16 instructions on this CPU: fp32")
    assert not choices.cache_file().exists()


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


def test_the_kernel_and_dtype_kept_are_the_fastest_pair_by_their_margins():
    pairs = {f"{d} {k}": (d, k) for d in ("fp32", "bf16") for k in ("sdpa", "math")}
    ms = {"fp32 sdpa": 100.0, "fp32 math": 90.0, "bf16 sdpa": 120.0, "bf16 math": 80.0}
    assert tune._prefer_pair(ms, pairs) == "bf16 math"  # 80 <= 0.95 * 90
    ms["bf16 math"] = 86.0  # within bf16's margin of fp32's best: the exact one
    assert tune._prefer_pair(ms, pairs) == "fp32 math"
    ms["fp32 math"], ms["bf16 math"] = 98.0, 119.0  # within the kernel's margin: the default
    assert tune._prefer_pair(ms, pairs) == "fp32 sdpa"
    one = {"sdpa": ("fp32", "sdpa"), "math": ("fp32", "math")}
    assert tune._prefer_pair({"sdpa": 100.0, "math": 96.0}, one) == "math"


def kernel_auto(**train):
    return tiny_config(model={"kernel": "auto"}, train={"max_steps": 2, "eval_every": 0, **train})


def test_a_kernel_left_to_auto_is_measured_recorded_in_the_config_and_kept_on_resume(
    tmp_path, monkeypatch, capsys
):
    from lm.config.load import load_config

    monkeypatch.setenv("LM_TUNE", "on")
    monkeypatch.setattr(tune, "_prefer_kernel", lambda ms: "math")
    train(kernel_auto(checkpoint_every=1), tmp_path / "run")
    first = ran(tmp_path / "run")
    choice = first["kernel_choice"]
    assert choice["how"] == "measured" and set(choice["ms_per_step"]) == {"sdpa", "math"}
    assert first["kernel"] == "math" and choice["value"] == "math"
    # The run's config names the kernel that ran, so evaluation and sampling run it too.
    assert load_config(tmp_path / "run" / "config.yaml").model.kernel == "math"
    assert "auto: model.kernel math, measured now on this machine" in capsys.readouterr().err
    # The same losses as the kernel named: measuring draws nothing from the run's generators.
    train(kernel_auto(checkpoint_every=1).replace(model=dataclasses.replace(
        kernel_auto().model, kernel="math")), tmp_path / "named")  # fmt: skip
    assert losses(tmp_path / "run") == losses(tmp_path / "named")
    # A resume keeps the kernel it trained with, whatever this machine would say now.
    choices.clear()
    monkeypatch.setattr(tune, "_prefer_kernel", lambda ms: "sdpa")
    train(kernel_auto(max_steps=4, checkpoint_every=1), tmp_path / "run", resume=True)
    resumed = ran(tmp_path / "run")
    assert resumed["kernel"] == "math" and resumed["kernel_choice"]["how"] == "resumed"
    assert not choices.read()  # nothing was measured for it


def test_dtype_and_kernel_left_to_auto_are_measured_together(tmp_path, measuring):
    train(kernel_auto(dtype="auto"), tmp_path / "run")
    record = ran(tmp_path / "run")
    dtype, kernel = record["dtype_choice"], record["kernel_choice"]
    both = {"fp32 sdpa", "fp32 math", "bf16 sdpa", "bf16 math"}
    assert set(dtype["ms_per_step"]) == both and dtype["ms_per_step"] == kernel["ms_per_step"]
    assert f"{dtype['value']} {kernel['value']}" in both
    (key,) = choices.read()
    assert json.loads(key)["kind"] == "train.dtype+model.kernel"


def test_a_padded_run_is_measured_at_its_batches_width_not_the_whole_context(tmp_path, measuring):
    from lm.config.load import load_config
    from lm.data.sources import prepare_data

    copy = {
        "source": "builtin:copy", "mode": "padded", "task_lengths": "1-4",
        "task_eval_lengths": "1-4", "task_examples": 200, "cache_dir": str(tmp_path / "c"),
    }  # fmt: skip
    train_keys = {"max_steps": 2, "eval_every": 0, "dtype": "auto"}
    cfg = tiny_config(model={"kernel": "auto"}, data=copy, train=train_keys)
    train(cfg, tmp_path / "run")
    (key,) = choices.read()
    trained = load_config(tmp_path / "run" / "config.yaml")  # the vocabulary filled in
    width = tune.batch_width(trained, prepare_data(cfg.data, log=None))
    assert json.loads(key)["width"] == width < cfg.model.context_length / 2


def test_a_kernel_not_measured_is_sdpa_and_says_why(tmp_path, monkeypatch):
    train(kernel_auto(), tmp_path / "off")  # the suite runs with LM_TUNE=off
    choice = ran(tmp_path / "off")["kernel_choice"]
    assert (choice["value"], choice["how"], choice["why"]) == ("sdpa", "fallback", "LM_TUNE=off")
    monkeypatch.setenv("LM_TUNE", "on")
    # A learned bias trains through the explicit formula on a CPU whatever the kernel.
    cfg = kernel_auto()
    cfg = cfg.replace(model=dataclasses.replace(cfg.model, position="t5"))
    train(cfg, tmp_path / "t5")
    choice = ran(tmp_path / "t5")["kernel_choice"]
    assert choice["how"] == "fallback" and "explicit formula" in choice["why"]
    assert not choices.cache_file().exists()


def losses(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [m["train_loss"] for m in lines if "train_loss" in m]


def test_jobs_auto_weighs_each_model_of_a_sweep_once_against_the_first():
    import dataclasses

    from lm.compare.auto_jobs import step_weights

    cfg = tiny_config(model={"vocab_size": 40})
    deeper = dataclasses.replace(cfg.model, n_layer=cfg.model.n_layer + 2)
    before = torch.get_num_threads()
    weights = step_weights([cfg.model, deeper, cfg.model], cfg.train, (2, 8))
    assert weights[0] == weights[2] == 1.0  # the same model: one timing, read twice
    assert weights[1] > 0 and weights[1] != 1.0
    assert torch.get_num_threads() == before  # timed on one thread, then given back


def test_jobs_auto_weighs_against_a_step_timed_alone_never_one_timed_beside_other_jobs(
    monkeypatch,
):
    # The other models are timed alone in this process. The first's step may stand for its
    # timing only where it was timed so too (the in-process probe); a kept measurement of jobs
    # side by side gives a step slowed by the other jobs, which would weigh the others too light.
    import lm.compare.auto_jobs as sbs

    cfg = tiny_config(model={"vocab_size": 40})
    device = torch.device("cpu")
    monkeypatch.setenv("LM_TUNE", "on")
    monkeypatch.setattr(sbs, "_one", lambda m, t, micro, cores: (0.020, None))
    monkeypatch.setattr(sbs, "_together", lambda m, t, micro, cores: (0.015, 1.0))
    monkeypatch.setattr(sbs, "_probe", lambda m, t, micro, cores: (0.020, 0.025))
    calls = []

    def weigh(seconds, step, alone):
        calls.append((step, alone))
        return [1.0] * 4

    sbs.auto_jobs(cfg, device, 2, runs=4, steps=1000, weigh=weigh)  # probed, then measured
    sbs.auto_jobs(cfg, device, 2, runs=4, steps=1000, weigh=weigh)  # the measurement kept
    assert calls[0] == (pytest.approx(0.025), True)  # the probe's one-thread step, alone
    assert calls[1] == (pytest.approx(0.030), False)  # 2 x 15 ms: a step beside another job


GOOD = {  # a kept entry of each kind lm keeps: its context, and what it holds
    "train.dtype": ({"threads": 1}, "bf16", {"fp32": 2.0, "bf16": 1.0}),
    "model.kernel": ({"threads": 1}, "math", {"sdpa": 2.0, "math": 1.0}),
    "train.dtype+model.kernel": (
        {"threads": 1},
        "bf16 sdpa",
        {"fp32 sdpa": 4.0, "fp32 math": 3.0, "bf16 sdpa": 1.0, "bf16 math": 2.0},
    ),
    "compare.probe": ({"cores": 2}, "probe", {"every": 5.0, "one": 9.0}),
    "compare.jobs": ({"cores": 2}, "2", {"1": 5.0, "2": 4.0, "start": 900.0}),
}
GONE = object()  # a field left out

DAMAGED = [
    ("compare.probe", "ms_per_step", {}),
    ("compare.probe", "ms_per_step", {"every": 0, "one": 0}),
    ("compare.probe", "ms_per_step", {"every": 5.0}),
    ("compare.probe", "value", "1"),
    ("train.dtype+model.kernel", "value", "fp64 math"),
    ("train.dtype+model.kernel", "ms_per_step", GONE),
    ("train.dtype+model.kernel", "ms_per_step", {"bf16 sdpa": 1.0}),
    ("train.dtype", "ms_per_step", {"fp32": 2.0, "bf16": 1.0, "fp16": 0.5}),
    ("train.dtype", "ms_per_step", {"fp32": True, "bf16": 1.0}),
    ("train.dtype", "ms_per_step", {"fp32": -1.0, "bf16": 1.0}),
    ("train.dtype", "ms_per_step", {"fp32": float("inf"), "bf16": 1.0}),
    ("train.dtype", "value", ["bf16"]),
    ("train.dtype", "measured", GONE),
    ("model.kernel", "value", "flex"),
    ("compare.jobs", "value", "3"),
    ("compare.jobs", "ms_per_step", {"1": 5.0, "2": 4.0}),
]


def keep(kind, field=None, value=None, key=None):
    """choices.json holding the good entry of ``kind``, with ``field`` set to ``value``."""
    context, chosen, ms = GOOD[kind]
    entry = {"value": chosen, "ms_per_step": ms, "measured": "2025-01-01T00:00:00+00:00"}
    if field is not None:
        entry[field] = value
        entry = {k: v for k, v in entry.items() if v is not GONE}
    path = choices.cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({key or choices.key(kind, context): entry}))
    return context, entry


@pytest.mark.parametrize("kind", GOOD)
def test_an_entry_lm_keeps_is_read_and_listed(kind, capsys):
    context, entry = keep(kind)
    assert list(choices.read().values()) == [entry]
    candidates = {"probe": None} if kind == "compare.probe" else entry["ms_per_step"]
    assert choices.cached(kind, context, candidates).how == "cached"
    assert main(["choices"]) == 0
    out = capsys.readouterr()
    assert "1 measured choice(s)" in out.err and out.out.startswith(f"{kind}: ")


@pytest.mark.parametrize(("kind", "field", "value"), DAMAGED)
def test_a_damaged_entry_is_absent_to_every_reader(kind, field, value, capsys):
    context, _ = keep(kind, field, value)
    assert choices.read() == {}
    names = GOOD[kind][2]
    assert choices.cached(kind, context, {"probe": None, **names, "fp64 math": None}) is None
    assert main(["choices"]) == 0
    out = capsys.readouterr()
    assert "0 measured choice(s)" in out.err and "1 entry not of lm's: ignored" in out.err
    assert out.out == ""


@pytest.mark.parametrize("where", ["file", "key"])
def test_a_cache_nested_too_deep_for_json_is_absent_never_a_recursion_error(
    where, tmp_path, measuring, capsys
):
    deep = "[" * 200_000
    path = choices.cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    if where == "file":
        path.write_text(deep)
    else:
        keep("train.dtype", key=deep)
    assert main(["choices"]) == 0
    out = capsys.readouterr()
    assert "0 measured choice(s)" in out.err and out.out == ""
    train(auto_config(), tmp_path / "run")  # measured anew, and kept in lm's own file
    assert ran(tmp_path / "run")["dtype_choice"]["how"] == "measured"
    assert len(choices.read()) == 1


def spoil(kind, field, value):
    """The kept entry of ``kind`` (the file's only one) with ``field`` set to ``value``."""
    path = choices.cache_file()
    entries = json.loads(path.read_text())
    (key,) = [k for k in entries if json.loads(k)["kind"] == kind]
    entries[key][field] = value
    entries[key] = {k: v for k, v in entries[key].items() if v is not GONE}
    path.write_text(json.dumps(entries))


@pytest.mark.parametrize("value", ["fp64 math", GONE])
def test_a_run_measures_anew_beside_a_damaged_entry_of_its_shape(
    value, tmp_path, measuring, capsys
):
    train(kernel_auto(dtype="auto"), tmp_path / "a")
    spoil("train.dtype+model.kernel", "value" if value != GONE else "ms_per_step", value)
    capsys.readouterr()
    train(kernel_auto(dtype="auto"), tmp_path / "b")
    assert ran(tmp_path / "b")["dtype_choice"]["how"] == "measured"
    err = capsys.readouterr().err
    assert "measured now on this machine (fp32 sdpa " in err and "( a step" not in err


@pytest.mark.parametrize("timings", [{}, {"every": 0, "one": 0}, {"every": 0.0, "one": 9.0}])
def test_jobs_auto_probes_anew_beside_a_damaged_probe(timings, monkeypatch):
    import lm.compare.auto_jobs as sbs

    monkeypatch.setenv("LM_TUNE", "on")
    probes = []
    monkeypatch.setattr(sbs, "_probe", lambda *a: probes.append(1) or (0.02, 0.03))
    cfg, device = tiny_config(model={"vocab_size": 40}), torch.device("cpu")
    assert sbs.auto_jobs(cfg, device, 2, runs=2, steps=10)[1].how == "probed"  # no more pays
    spoil("compare.probe", "ms_per_step", timings)
    n, choice = sbs.auto_jobs(cfg, device, 2, runs=2, steps=10)
    assert (n, choice.how, len(probes)) == (1, "probed", 2)
    assert choice.ms_per_step["1"] == 20.0


def test_the_candidates_a_run_times_are_those_the_cache_keeps():
    assert tuple(tune.DTYPES) == choices.TIMED["train.dtype"]  # KERNELS is TIMED's own


def test_jobs_auto_says_a_probe_beside_other_work_was_not_kept(monkeypatch):
    import lm.compare.auto_jobs as sbs
    from lm.compare.sweep import _said

    monkeypatch.setenv("LM_TUNE", "on")
    readings = iter(range(0, 10**6, 1000))
    monkeypatch.setattr(choices, "cpu_seconds", lambda: (float(next(readings)), 2))
    monkeypatch.setattr(sbs, "_probe", lambda *a: (0.02, 0.03))
    cfg, device = tiny_config(model={"vocab_size": 40}), torch.device("cpu")
    n, choice = sbs.auto_jobs(cfg, device, 2, runs=2, steps=10)
    assert (n, choice.how) == (1, "probed") and "other work kept" in choice.not_kept
    assert "the steps not kept: other work kept" in _said(choice) and choices.read() == {}
