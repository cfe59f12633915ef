"""How a config value is written and read back as text: lists and nulls as YAML writes them
inline, comma-separated sweep values, RoPE's context extensions (``pi:4``) and a task's lengths
(``1-20``). Each parser names the key in its one-line error."""

from __future__ import annotations

import math
from typing import Any

from lm.config.errors import ConfigError
from lm.config.names import ROPE_SCALINGS


def value_text(value: Any) -> str:
    """A config value as YAML writes it inline: lists as ``[a, b, ...]``, None as ``null``,
    booleans as ``true``/``false``, the rest as text."""
    if isinstance(value, list):
        return "[" + ", ".join(map(value_text, value)) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def split_values(text: str) -> list[str]:
    """``"rope,[rope,none],alibi"`` -> ``["rope", "[rope,none]", "alibi"]``: values separated by
    the commas outside brackets, stripped; empty ones dropped."""
    values, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth <= 0:
            values.append(text[start:i].strip())
            start = i + 1
    return [v for v in values if v]


def parse_rope_scaling(text: str | None, key: str = "model.rope_scaling") -> tuple[str, float]:
    """``"pi:4"`` -> ``("pi", 4.0)``; None or ``"none"`` -> ``("none", 1.0)``. ``key`` names the
    setting in the one-line error (a config key or a flag)."""
    if text is None or text.strip() == "none":
        return "none", 1.0
    allowed = "none, " + ", ".join(f"{m}:FACTOR" for m in ROPE_SCALINGS[1:])
    method, colon, factor_text = text.strip().partition(":")
    if method not in ROPE_SCALINGS[1:]:
        raise ConfigError(f"{key}: {text!r} is not one of {allowed} (for example yarn:4)")
    if not colon:
        raise ConfigError(f"{key}: {text!r} needs a factor, for example {method}:4")
    try:
        factor = float(factor_text)
    except ValueError:
        raise ConfigError(f"{key}: the factor of {text!r} is not a number") from None
    if not (math.isfinite(factor) and factor >= 1.0):
        raise ConfigError(
            f"{key}: the factor of {text!r} must be a number >= 1 (how many times the trained "
            "context to reach)"
        )
    return method, factor


def parse_task_lengths(text: str | int, key: str) -> range:
    """``"1-20"`` -> ``range(1, 21)``; a single ``"8"`` (or ``8``) is ``range(8, 9)``. ``key``
    names the setting in the one-line error (a ConfigError)."""
    low, dash, high = str(text).strip().partition("-")
    try:
        lo, hi = int(low), int(high if dash else low)
    except ValueError:
        raise ConfigError(f"{key}: {text!r} is not a range of lengths such as 1-20") from None
    if not 1 <= lo <= hi:
        raise ConfigError(f"{key}: {text!r} must go from a length >= 1 up to one >= it")
    return range(lo, hi + 1)
