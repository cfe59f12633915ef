"""How a config value is written and read back as text: lists and nulls as YAML writes them
inline, comma-separated sweep values, RoPE's context extensions (``pi:4``), a task's lengths
(``1-20``) and evaluation lengths (``1x,2x,512``). Each parser names the key in its one-line
error."""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from lm.config.errors import ConfigError, LMError
from lm.config.names import ROPE_SCALINGS


def value_text(value: Any) -> str:
    """A config value as YAML writes it inline: lists as ``[a, b, ...]``, None as ``null``,
    booleans as ``true``/``false``, the rest as text."""
    if isinstance(value, list):
        return "[" + ", ".join(map(value_text, value)) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def shown(value: Any) -> str:
    """A value as a message quotes it, in the config's own words: ``null``, ``true``,
    ``false``, lists as ``[a, b]``, strings quoted."""
    if isinstance(value, str):
        return repr(value)
    return value_text(value)


def split_values(text: str, where: str) -> list[str]:
    """``"rope,[rope,none],alibi"`` -> ``["rope", "[rope,none]", "alibi"]``: the values of a
    ``--vary``, separated by the commas outside brackets and quotes, each stripped. Brackets
    must pair, quotes must close, and no value may be empty (two commas in a row, or one at an
    end): otherwise a ConfigError naming ``where`` (the flag and key)."""
    values, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"{where}: {text!r} closes a bracket it did not open")
        elif char == "," and depth == 0:
            values.append(text[start:i])
            start = i + 1
    if quote:
        raise ConfigError(f"{where}: {text!r} opens a {quote} quote and does not close it")
    if depth:
        raise ConfigError(f"{where}: {text!r} opens a [ bracket and does not close it")
    values = [value.strip() for value in [*values, text[start:]]]
    if "" in values:
        raise ConfigError(
            f"{where}: {text!r} has an empty value (two commas in a row, or one at an end)"
        )
    return values


class ConfigLoader(yaml.SafeLoader):
    """Safe YAML that reads numbers as users write them: YAML 1.1 (PyYAML) takes ``3e-4`` and
    ``1E5`` for strings, since its floats need a dot and a signed exponent."""


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_value(text: str, where: str = "--set") -> Any:
    """A command-line value: a list in brackets, ``[rope, none]``, of names or numbers; or one
    YAML scalar (``3e-4`` is a number, ``true`` a bool, ``~`` None, ``'a,b'`` a string). A
    list that is not one (an unclosed or extra bracket, an empty item, a list inside it) is a
    ConfigError naming ``where``; text YAML reads as something else (``builtin:``, a mapping)
    stays the text it is."""
    stripped = text.strip()
    if stripped.startswith("[") or stripped.endswith("]"):
        if not (stripped.startswith("[") and stripped.endswith("]")):
            raise ConfigError(f"{where}: {text!r} is not a list: a list is [a, b, ...]")
        inner = stripped[1:-1]
        if not inner.strip():
            return []
        items = split_values(inner, where)
        if any(item.startswith("[") for item in items):
            raise ConfigError(f"{where}: {text!r} holds a list inside the list; give names")
        return [parse_value(item, where) for item in items]
    try:
        value = yaml.load(text, Loader=ConfigLoader) if stripped else text
    except yaml.YAMLError:
        return text
    if isinstance(value, (dict, list)):  # builtin: reads as {"builtin": None}
        return text
    # YAML 1.1 reads "3e-4" as a string; accept it as the number a user meant.
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


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


def whole_number(value: Any, at_least: int, name: str = "") -> int:
    """``value`` (an int, or its text from a flag) if it is a whole number of at least
    ``at_least``; else an LMError naming ``name`` (a flag's own parser names the flag itself).
    The command line's flags and the Python API's arguments are checked by this one function."""
    prefix = f"{name}: " if name else ""
    number = value
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int):
        raise LMError(f"{prefix}{value!r} is not an integer")
    if number < at_least:
        raise LMError(f"{prefix}{value!r} must be at least {at_least}")
    return number


def finite_at_least_zero(value: Any, name: str = "") -> float:
    """``value`` (a number, or its text) if it is a finite number >= 0 (a temperature); else an
    LMError naming ``name``, as :func:`whole_number`."""
    prefix = f"{name}: " if name else ""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        raise LMError(f"{prefix}{value!r} is not a number") from None
    if not (number >= 0.0 and math.isfinite(number)):
        raise LMError(f"{prefix}{value!r} must be a finite number >= 0")
    return number


def checked_text(text: Any, where: str) -> str:
    """``text`` if it is Unicode text; bytes that are not UTF-8 reach Python as lone surrogates
    (argv and standard input decode with ``surrogateescape``), which no tokenizer can take."""
    if not isinstance(text, str):
        raise LMError(f"{where}: {text!r} is not text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = text[e.start].encode("utf-8", "surrogateescape")
        raise LMError(
            f"{where}: not valid UTF-8 text (byte {raw!r} at character {e.start})"
        ) from None
    return text


def parse_context_lengths(text: str) -> list[str]:
    """``"1x,1.5x,512"`` -> ``["1x", "1.5x", "512"]``: evaluation lengths, each a whole number
    of tokens (at least 2) or a multiple of the trained context written with an ``x``. A value
    given twice is kept once. Raises ValueError with a one-line reason."""
    specs: list[str] = []
    for item in (v.strip().lower() for v in text.split(",")):
        if not item:
            continue
        if item.endswith("x"):
            try:
                multiple = float(item[:-1])
            except ValueError:
                multiple = math.nan
            if not (math.isfinite(multiple) and multiple > 0):
                raise ValueError(f"{item!r} is not a positive multiple such as 2x or 1.5x")
            spec = f"{multiple:g}x"
        else:
            try:
                tokens = int(item)
            except ValueError:
                raise ValueError(
                    f"{text!r} is not a comma-separated list of lengths: whole numbers of "
                    "tokens (e.g. 256) or multiples of the trained context (e.g. 2x, 1.5x)"
                ) from None
            if tokens < 2:
                raise ValueError(f"{item!r}: a length in tokens must be at least 2")
            spec = str(tokens)
        if spec not in specs:
            specs.append(spec)
    if not specs:
        raise ValueError(f"{text!r}: no lengths given")
    return specs
