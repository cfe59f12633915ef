"""What ``train.dtype: auto`` and ``model.kernel: auto`` pick: on a CPU a rule of its bf16
hardware and the model's width (the figures behind it: docs/performance.md), the same on a busy
machine or a quiet one; what a run records of it, and a resume keeping what it trained with."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from _support import losses, tiny_config

from lm.config.load import load_config
from lm.config.sections import ModelConfig
from lm.runtime import device as runtime
from lm.runtime.device import auto_rule, cpu_bf16_kind, resolve_dtype
from lm.training.loop import train

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "kind"),
    [(True, True, "amx"), (False, True, "avx512_bf16"), (False, False, "none")],
)
def test_the_cpu_bf16_kind_comes_from_torchs_own_detection(monkeypatch, amx, avx512_bf16, kind):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert cpu_bf16_kind() == kind


KINDS = ("amx", "avx512_bf16", "none")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("width", [64, 128, 256])
def test_auto_on_a_cpu_is_a_rule_of_the_cpus_bf16_kind_and_the_width(monkeypatch, kind, width):
    """bf16 with the explicit kernel on a CPU with bf16 instructions from width 128, else fp32
    with SDPA: a pure function of the CPU kind and the config, so that a busy machine cannot
    change what a command trains (nothing is timed: the same answer every call)."""
    monkeypatch.setattr(runtime, "cpu_bf16_kind", lambda: kind)
    model = ModelConfig(d_model=width, n_head=4)
    fast = kind != "none" and width >= 128
    picked = ("bf16", "math") if fast else ("fp32", "sdpa")
    assert {auto_rule("auto", "auto", model, CPU)[:2] for _ in range(3)} == {picked}
    why = auto_rule("auto", "auto", model, CPU)[2]
    if kind == "none":
        assert why == "no bf16 instructions on this CPU"
    else:
        assert why == f"bf16 instructions ({kind}), width {width} {'>=' if fast else '<'} 128"
    # A setting the config names is kept; the other takes the pair only with it.
    assert auto_rule("bf16", "auto", model, CPU)[:2] == ("bf16", picked[1])
    assert auto_rule("auto", "math", model, CPU)[:2] == (picked[0], "math")
    assert auto_rule("fp32", "auto", model, CPU)[:2] == ("fp32", "sdpa")
    assert auto_rule("auto", "sdpa", model, CPU)[:2] == ("fp32", "sdpa")
    assert auto_rule("auto", "flex", model, CPU)[:2] == ("fp32", "flex")
    if fast:
        assert auto_rule("auto", "sdpa", model, CPU)[2].endswith(
            ", but the config names model.kernel sdpa"
        )
    assert (
        resolve_dtype("auto", CPU, model)
        == {"fp32": torch.float32, "bf16": torch.bfloat16}[picked[0]]
    )
    # A dtype written out is taken as written, whatever the hardware.
    assert resolve_dtype("fp32", CPU, model) == torch.float32
    assert resolve_dtype("bf16", CPU, model) == torch.bfloat16


def test_auto_elsewhere_than_a_cpu_is_sdpa(monkeypatch):
    model = ModelConfig(d_model=256, n_head=4)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert auto_rule("auto", "auto", model, torch.device("cuda"))[:2] == ("fp16", "sdpa")
    assert auto_rule("auto", "auto", model, torch.device("mps"))[:2] == ("fp32", "sdpa")


def ran(run_dir, sitting=-1):
    record = json.loads((run_dir / "run.json").read_text())
    return [record["ran"], *(r["ran"] for r in record.get("resumes", []))][sitting]


def wide(**train):
    """A tiny run at width 128, dtype and kernel left to auto."""
    keys = {"max_steps": 2, "eval_every": 0, "dtype": "auto", **train}
    return tiny_config(model={"d_model": 128, "kernel": "auto"}, train=keys)


def test_a_run_left_to_auto_records_the_rule_and_trains_as_the_pair_named(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(runtime, "cpu_bf16_kind", lambda: "avx512_bf16")
    train(wide(), tmp_path / "auto")
    record = ran(tmp_path / "auto")
    why = "bf16 instructions (avx512_bf16), width 128 >= 128"
    assert (record["dtype"], record["kernel"]) == ("bfloat16", "math")
    assert record["dtype_choice"] == {"value": "bf16", "how": "rule", "why": why}
    assert record["kernel_choice"] == {"value": "math", "how": "rule", "why": why}
    # The run's config names the kernel that ran, so evaluation and sampling run it too.
    assert load_config(tmp_path / "auto" / "config.yaml").model.kernel == "math"
    assert f"lm: auto: train.dtype bf16, model.kernel math (rule: {why})" in capsys.readouterr().err
    # The same numbers as the pair named: choosing draws nothing from the run's generators.
    named = wide(dtype="bf16")
    train(named.replace(model=dataclasses.replace(named.model, kernel="math")), tmp_path / "named")
    assert losses(tmp_path / "auto") == losses(tmp_path / "named")
    assert "dtype_choice" not in ran(tmp_path / "named")


def test_a_resume_keeps_the_dtype_and_kernel_it_trained_with(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runtime, "cpu_bf16_kind", lambda: "amx")
    train(wide(checkpoint_every=1), tmp_path / "run")
    assert (ran(tmp_path / "run")["dtype"], ran(tmp_path / "run")["kernel"]) == ("bfloat16", "math")
    monkeypatch.setattr(runtime, "cpu_bf16_kind", lambda: "none")  # the rule would now say fp32
    capsys.readouterr()
    train(wide(max_steps=4, checkpoint_every=1), tmp_path / "run", resume=True)
    resumed = ran(tmp_path / "run")
    assert (resumed["dtype"], resumed["kernel"]) == ("bfloat16", "math")
    said = {"how": "resumed", "why": "what it trained with"}
    assert resumed["dtype_choice"] == {"value": "bf16", **said}
    assert resumed["kernel_choice"] == {"value": "math", **said}
    err = capsys.readouterr().err
    assert "lm: auto: train.dtype bf16, model.kernel math (resumed: what it trained with)" in err


def test_a_model_whose_step_runs_the_formula_anyway_keeps_it(tmp_path, monkeypatch):
    # A learned bias trains through the explicit formula on a CPU whatever the kernel.
    monkeypatch.setattr(runtime, "cpu_bf16_kind", lambda: "none")
    cfg = tiny_config(model={"position": "t5", "kernel": "auto"}, train={"max_steps": 1})
    train(cfg, tmp_path / "t5")
    record = ran(tmp_path / "t5")
    assert (record["kernel"], record["kernel_choice"]["value"]) == ("math", "sdpa")
