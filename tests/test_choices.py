"""``lm compare --jobs auto`` times the sweep's step on the machine that runs it, once per shape,
keeps it, decides from one prediction, and ``lm choices`` shows and forgets what is kept; a
damaged or foreign cache is absent to every reader."""

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
from _support import tiny_config, write_config

import lm.compare.auto_jobs as sbs
from lm.cli import main
from lm.runtime import choices
from lm.runtime import device as runtime
from lm.runtime.choices import cpu_seconds

CPU = torch.device("cpu")
CONTEXT = {"cores": 2, "model": {"d_model": 64}}


def counted(ms: dict[str, float], calls: list[int]):
    """A measurement giving ``ms``, counting its calls."""

    def measure():
        calls.append(1)
        return dict(ms)

    return measure


def test_a_timing_is_measured_once_per_shape_and_machine_then_read_back(monkeypatch):
    calls: list[int] = []
    measure = counted({"every": 20.0, "one": 30.0}, calls)
    made = choices.timing(CONTEXT, measure, cpus_used=2)
    assert (made.ms, made.how, made.not_kept) == ({"every": 20.0, "one": 30.0}, "measured", "")
    # The same shape on the same machine: read back, nothing timed.
    again = choices.timing(CONTEXT, measure, cpus_used=2)
    assert (again.ms, again.how, len(calls)) == (made.ms, "cached", 1)
    # Another shape, another CPU or another torch is measured anew.
    choices.timing({**CONTEXT, "cores": 4}, measure, cpus_used=4)
    assert len(calls) == 2
    monkeypatch.setattr(choices, "cpu_name", lambda: "Intel(R) Xeon(R) Platinum 8488C")
    choices.timing(CONTEXT, measure, cpus_used=2)
    assert len(calls) == 3
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    choices.timing(CONTEXT, measure, cpus_used=2)
    assert len(calls) == 4 and len(choices.read()) == 4


def test_a_timing_beside_other_work_is_used_but_not_kept(monkeypatch):
    monkeypatch.setattr(choices, "cpu_seconds", cpu_seconds)  # watched, as outside the suite
    if cpu_seconds() is None:
        pytest.skip("no /proc/stat: nothing is watched on this system")

    def idle():  # a measurement that leaves the CPUs to whatever else runs
        time.sleep(0.3)
        return {"every": 1.0, "one": 2.0}

    spin = "print('spinning', flush=True)\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout.readline() == "spinning\n"  # it is busy before the measurement
        made = choices.timing(CONTEXT, idle, cpus_used=cpu_seconds()[1])
    finally:
        spinner.kill()
        spinner.wait()
    assert (made.how, made.ms) == ("measured", {"every": 1.0, "one": 2.0})
    assert re.fullmatch(
        r"other work kept \d+\.\d of this machine's \d+ CPUs busy while it ran", made.not_kept
    )
    assert choices.read() == {}  # the next sweep measures again


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


def test_a_damaged_cache_counts_as_empty_and_is_rewritten():
    choices.cache_file().parent.mkdir(parents=True, exist_ok=True)
    choices.cache_file().write_bytes(b"\xff not json")
    assert choices.read() == {}
    assert choices.timing(CONTEXT, counted({"every": 1.0, "one": 2.0}, []), 2).how == "measured"
    assert len(choices.read()) == 1


def test_lm_choices_shows_the_cache_and_forgets_it(capsys):
    shape = {"d_model": 64, "n_layer": 2, "context_length": 32}
    context = {"cores": 2, "micro_batch": 8, "width": 32, "model": shape}
    choices.timing(context, counted({"every": 10.0, "one": 18.0}, []), cpus_used=2)
    assert main(["choices"]) == 0
    out = capsys.readouterr()
    assert f"1 kept timing(s) in {choices.cache_file()}" in out.err
    assert out.out.startswith("a step on every core 10 ms, on one thread 18 ms (measured ")
    assert "d_model=64 n_layer=2 context=32 micro_batch=8 width=32 cores=2 on " in out.out
    assert main(["choices", "--clear"]) == 0
    assert "forgot 1 kept timing(s)" in capsys.readouterr().err
    assert choices.read() == {}


def fake_probe(monkeypatch):
    """``--jobs auto`` timing on, its step's milliseconds faked: the timings it will get (to
    change) and the cores of each measurement."""
    monkeypatch.setenv("LM_TUNE", "on")
    timings = {"every": 20.0, "one": 30.25}
    calls: list[int] = []

    def probe(step, cores):
        calls.append(cores)
        return dict(timings)

    monkeypatch.setattr(sbs, "probe", probe)
    return timings, calls


@pytest.fixture
def probed(monkeypatch):
    return fake_probe(monkeypatch)


def test_jobs_auto_takes_a_job_per_core_only_where_the_whole_sweep_gains(monkeypatch):
    cfg = tiny_config(model={"vocab_size": 40})
    # Timing off (the suite), one core or one run: one job, saying why.
    off = sbs.auto_jobs(cfg, CPU, 2, 2, 100)
    assert (off.jobs, off.why) == (1, "LM_TUNE=off")
    timings, calls = fake_probe(monkeypatch)
    assert sbs.auto_jobs(cfg, CPU, 1, 2, 100).why == "one thread to divide"
    assert sbs.auto_jobs(cfg, CPU, 2, 1, 100).why == "one run to train"
    assert calls == []
    # 4 runs of 1000 steps at 20 ms a step on both cores: 80 s one at a time; side by side a
    # job's start (2.5 s, once: a worker trains one run after another), then two rounds of
    # 1000 one-thread steps of 30.25 ms: 63 s.
    made = sbs.auto_jobs(cfg, CPU, 2, runs=4, steps=1000)
    assert (made.jobs, made.how, made.ms) == (2, "measured", timings)
    assert made.why == "4 runs of 1000 steps: about 63 s 2 at a time, 80 s one at a time"
    # The same shape read back, for 3 short runs: 6 s one at a time; 2.5 s and 100 one-thread
    # steps for the first two, then the third alone on both cores (2 s): 7.5 s. One job.
    made = sbs.auto_jobs(cfg, CPU, 2, runs=3, steps=100)
    assert (made.jobs, made.how, calls) == (1, "cached", [2])
    assert sbs.predict(0.020, 0.03025, 2, 3, 100) == pytest.approx((6.0, 2.5 + 3.025 + 2.0))
    # Fewer runs than cores: no round side by side, one job.
    assert sbs.predict(0.020, 0.010, 4, 3, 100)[1] > sbs.predict(0.020, 0.010, 4, 3, 100)[0]
    # A gain within the margin does not pay: 80 s against 2.5 s + 2 x 1000 x 37 ms = 76.5 s.
    choices.clear()
    timings["one"] = 37.0
    assert sbs.auto_jobs(cfg, CPU, 2, runs=4, steps=1000).jobs == 1
    wider = tiny_config(model={"vocab_size": 40, "d_model": 64})
    assert sbs.auto_jobs(wider, CPU, 2, runs=4, steps=1000).how == "measured"  # a new shape


def test_jobs_auto_times_the_step_the_sweeps_runs_train(tmp_path, probed, monkeypatch):
    """Its rows as wide as the sweep's batches (a padded run's are often far shorter than the
    context), its dtype and kernel the ones the runs train with (``auto_rule``)."""
    from lm.data.sources import prepare_data

    built = []

    def training_step(model, train, rows, width, dtype):
        built.append((model.kernel, rows, width, dtype))
        return lambda: None

    monkeypatch.setattr(sbs, "training_step", training_step)
    copy = {
        "source": "builtin:copy", "mode": "padded", "task_lengths": "1-4",
        "task_eval_lengths": "1-4", "task_examples": 200, "cache_dir": str(tmp_path / "c"),
    }  # fmt: skip
    cfg = tiny_config(model={"kernel": "auto"}, data=copy, train={"dtype": "auto"})
    data = prepare_data(cfg.data, log=None)
    cfg = cfg.replace(model=dataclasses.replace(cfg.model, vocab_size=40))
    monkeypatch.setattr(runtime, "cpu_bf16_kind", lambda: "none")
    sbs.auto_jobs(cfg, CPU, 2, 4, 1000, data)
    width = sbs.batch_width(cfg, data)
    assert built == [("sdpa", cfg.train.batch_size, width, torch.float32)]
    assert width < cfg.model.context_length / 2
    (key,) = choices.read()
    assert (json.loads(key)["width"], json.loads(key)["dtype"]) == (width, "fp32")
    # Packed, or wide enough for bf16 on a CPU with its instructions: other steps, timed anew.
    sbs.auto_jobs(cfg, CPU, 2, 4, 1000)
    assert built[1] == ("sdpa", cfg.train.batch_size, cfg.model.context_length, torch.float32)
    monkeypatch.setattr(runtime, "cpu_bf16_kind", lambda: "avx512_bf16")
    wide = cfg.replace(model=dataclasses.replace(cfg.model, d_model=128))
    sbs.auto_jobs(wide, CPU, 2, 4, 1000, data)
    assert built[2] == ("math", cfg.train.batch_size, width, torch.bfloat16)
    assert len(choices.read()) == 3


def test_the_timed_step_trains_on_every_core_then_one_and_draws_nothing():
    cfg = tiny_config(model={"vocab_size": 40})
    before, state = torch.get_num_threads(), torch.get_rng_state()
    step = sbs.training_step(cfg.model, cfg.train, 2, 5, torch.float32)
    ms = sbs.probe(step, 2)
    assert set(ms) == {"every", "one"} and all(v > 0 for v in ms.values())
    assert torch.get_num_threads() == before  # given back
    assert torch.equal(torch.get_rng_state(), state)  # a sweep's runs do not depend on it


def test_lm_compare_jobs_auto_says_what_it_decided(tmp_path, capsys):
    cfg = write_config(tmp_path / "tiny.yaml", train={"max_steps": 2, "eval_every": 0})
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    argv = ["compare", str(cfg), "--vary", "model.position=rope,none", "--set", cache]
    assert main([*argv, "--jobs", "auto", "--out", str(tmp_path / "s")]) == 0
    err = capsys.readouterr().err  # a test worker has one thread: either reason says 1
    assert re.search(r"compare: --jobs auto: 1 \((LM_TUNE=off|one thread to divide)\)", err)
    with pytest.raises(SystemExit):
        main([*argv, "--jobs", "some", "--out", str(tmp_path / "t")])
    assert "'some' is not a count of 1 or more, nor auto" in capsys.readouterr().err


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_lm_compare_jobs_auto_says_its_timings_and_whether_they_were_kept(
    tmp_path, probed, two_threads, monkeypatch, capsys
):
    timings, _ = probed
    timings["one"] = 37.0  # side by side would not pay: the runs train here, one at a time
    cfg = write_config(tmp_path / "tiny.yaml", train={"max_steps": 2, "eval_every": 0})
    argv = ["compare", str(cfg), "--vary", "model.position=rope,none", "--jobs", "auto"]
    argv += ["--set", f"data.cache_dir={tmp_path / 'cache'}"]
    said = "a step of one run on 2 threads 20 ms, on one thread 37 ms, measured {} on this machine"
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "compare: --jobs auto: 1 (2 runs of 2 steps: about " in err
    assert said.format("now") + f", kept in {choices.cache_file()})" in err
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    assert said.format("earlier") in capsys.readouterr().err
    choices.clear()
    readings = iter(range(0, 10**6, 1000))  # every CPU busy all the time, none of it this run
    monkeypatch.setattr(choices, "cpu_seconds", lambda: (float(next(readings)), 2))
    assert main([*argv, "--out", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    assert said.format("now") + ", not kept: other work kept" in err
    assert "the next sweep measures again" in err and choices.read() == {}


GOOD = {"ms_per_step": {"every": 5.0, "one": 9.0}, "measured": "2025-01-01T00:00:00+00:00"}
GONE = object()  # a field left out

DAMAGED = [
    ("ms_per_step", {}),
    ("ms_per_step", {"every": 0, "one": 0}),
    ("ms_per_step", {"every": 5.0}),
    ("ms_per_step", {"every": 5.0, "one": 9.0, "start": 900.0}),
    ("ms_per_step", {"every": True, "one": 9.0}),
    ("ms_per_step", {"every": -1.0, "one": 9.0}),
    ("ms_per_step", {"every": float("inf"), "one": 9.0}),
    ("ms_per_step", [5.0, 9.0]),
    ("ms_per_step", GONE),
    ("measured", GONE),
    ("measured", 5),
]


def keep(field=None, value=None, key=None):
    """choices.json holding the good entry for CONTEXT, with ``field`` set to ``value``."""
    entry = dict(GOOD)
    if field is not None:
        entry[field] = value
        entry = {k: v for k, v in entry.items() if v is not GONE}
    path = choices.cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({key or choices.key(CONTEXT): entry}))
    return entry


def test_an_entry_lm_keeps_is_read_and_listed(capsys):
    entry = keep()
    assert list(choices.read().values()) == [entry]
    assert choices.timing(CONTEXT, counted({}, []), 2).how == "cached"
    assert main(["choices"]) == 0
    out = capsys.readouterr()
    assert "1 kept timing(s)" in out.err and out.out.startswith("a step on every core 5 ms")


@pytest.mark.parametrize(("field", "value"), DAMAGED)
def test_a_damaged_entry_is_absent_to_every_reader(field, value, capsys):
    keep(field, value)
    assert choices.read() == {}
    calls: list[int] = []
    assert choices.timing(CONTEXT, counted({"every": 1.0, "one": 2.0}, calls), 2).how == "measured"
    assert calls == [1] and len(choices.read()) == 1  # rewritten as lm's own
    keep(field, value)
    assert main(["choices"]) == 0
    out = capsys.readouterr()
    assert "0 kept timing(s)" in out.err and "1 entry not of lm's: ignored" in out.err
    assert out.out == ""


def test_an_entry_of_a_kind_lm_no_longer_keeps_is_absent(capsys):
    # train.dtype: auto and model.kernel: auto were timed once; a rule decides them now.
    old = json.loads(choices.key(CONTEXT)) | {"kind": "train.dtype"}
    keep("ms_per_step", {"fp32": 2.0, "bf16": 1.0}, key=json.dumps(old, sort_keys=True))
    assert choices.read() == {}
    assert main(["choices"]) == 0
    assert "1 entry not of lm's: ignored" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["file", "key"])
def test_a_cache_nested_too_deep_for_json_is_absent_never_a_recursion_error(where, probed, capsys):
    deep = "[" * 200_000
    path = choices.cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    if where == "file":
        path.write_text(deep)
    else:
        keep(key=deep)
    assert main(["choices"]) == 0
    out = capsys.readouterr()
    assert "0 kept timing(s)" in out.err and out.out == ""
    cfg = tiny_config(model={"vocab_size": 40})
    assert sbs.auto_jobs(cfg, CPU, 2, 4, 1000).how == "measured"  # anew, kept in lm's own file
    assert len(choices.read()) == 1


@pytest.mark.parametrize("timings", [{}, {"every": 0, "one": 0}, {"every": 0.0, "one": 9.0}])
def test_jobs_auto_measures_anew_beside_a_damaged_entry_of_its_shape(timings, probed):
    _, calls = probed
    cfg = tiny_config(model={"vocab_size": 40})
    assert sbs.auto_jobs(cfg, CPU, 2, 4, 1000).how == "measured"
    path = choices.cache_file()
    entries = json.loads(path.read_text())
    (key,) = entries
    entries[key]["ms_per_step"] = timings
    path.write_text(json.dumps(entries))
    made = sbs.auto_jobs(cfg, CPU, 2, 4, 1000)
    assert (made.how, made.ms["every"], len(calls)) == ("measured", 20.0, 2)


def test_other_work_is_said_alone_or_beside_as_a_record_row_says_it(monkeypatch):
    watch = choices.OtherWork()
    for seen, said in [
        ((0.1, 2), "alone (other work 0.10 of 2 CPUs)"),
        ((1.5, 2), "beside other work (other work 1.50 of 2 CPUs)"),
        (None, "not watched (no /proc/stat)"),
    ]:
        monkeypatch.setattr(watch, "cpus", lambda seen=seen: seen)
        assert watch.said() == said
