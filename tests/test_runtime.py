"""What ``train.dtype: auto`` picks on a CPU: the kind of bf16 hardware, the width and the
attention kernel decide, by the table measured with scripts/dtype_speed.py."""

from __future__ import annotations

import pytest
import torch

from lm.config.sections import ModelConfig
from lm.runtime import device as runtime
from lm.runtime.device import cpu_bf16_kind, resolve_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "kind"),
    [(True, True, "amx"), (False, True, "avx512_bf16"), (False, False, "none")],
)
def test_the_cpu_bf16_kind_comes_from_torchs_own_detection(monkeypatch, amx, avx512_bf16, kind):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert cpu_bf16_kind() == kind


@pytest.mark.parametrize(
    ("kind", "kernel", "width", "picked"),
    [
        ("none", "sdpa", 768, torch.float32),
        ("none", "math", 768, torch.float32),
        ("avx512_bf16", "sdpa", 128, torch.float32),
        ("avx512_bf16", "sdpa", 256, torch.bfloat16),
        ("avx512_bf16", "flex", 256, torch.bfloat16),
        ("avx512_bf16", "math", 32, torch.float32),
        ("avx512_bf16", "math", 128, torch.bfloat16),
        ("amx", "sdpa", 128, torch.float32),
        ("amx", "math", 128, torch.float32),
        ("amx", "sdpa", 384, torch.bfloat16),
    ],
)
def test_auto_on_a_cpu_picks_bf16_from_the_measured_width(monkeypatch, kind, kernel, width, picked):
    monkeypatch.setattr(runtime, "cpu_bf16_kind", lambda: kind)
    model = ModelConfig(d_model=width, n_head=4, kernel=kernel)
    assert resolve_dtype("auto", CPU, model) == picked
    # A dtype written out is taken as written, whatever the hardware.
    assert resolve_dtype("fp32", CPU, model) == torch.float32
    assert resolve_dtype("bf16", CPU, model) == torch.bfloat16
