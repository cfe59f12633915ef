"""A config from YAML and the command line: files read as safe YAML only (no Python tags), dotted
overrides (``train.lr=3e-4``) checked exactly like the file, unknown keys refused with the
closest known one, and configs compared key by key (``config_diff``)."""

from __future__ import annotations

import difflib
import math
import os
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from lm.config.errors import ConfigError
from lm.config.sections import Config, DataConfig, ModelConfig, TrainConfig
from lm.config.values import ConfigLoader, parse_value, shown

SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


_TYPE_WORDS = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    list[str]: "a list of names",
    list: "a list",
}


_OLD_SWITCH_WORDS = {"true": True, "false": False, "auto": None}


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against the annotation ``hint``; ints are accepted where floats are."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise ConfigError(f"{key}: must not be empty")
    for t in options:
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{key}: must be a finite number, got {shown(value)}")
            return float(value)
        if t is str and isinstance(value, str):
            return value
        if t == list[str] and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        if t is list and isinstance(value, list):  # items checked by the section itself
            return list(value)
    # Configs written before the optional switches (compile, tensorboard) became true | false |
    # null stored them as the words "true", "false" and "auto"; those runs still load.
    if bool in options and type(None) in options and value in _OLD_SWITCH_WORDS:
        return _OLD_SWITCH_WORDS[value]
    wanted = " or ".join(_TYPE_WORDS[t] for t in options if t in _TYPE_WORDS)
    # Every optional key defaults to None, so null and leaving the key out are the same.
    default = " (or leave it out: null)" if type(None) in options else ""
    return _raise(f"{key}: expected {wanted}, got {shown(value)}{default}")


def _raise(message: str) -> Any:
    raise ConfigError(message)


def _name(key: Any) -> str:
    """A key as it can be shown in one line: plain names as they are, anything odd quoted."""
    text = str(key)
    return text if text.isprintable() and text.strip() == text and text else repr(key)


RENAMED = {("model", "attention"): "kernel"}
"""Keys that earlier versions spelled otherwise: read under their new names, so that every run
directory and export written before the rename still loads."""


def _renamed(section: str, values: dict[Any, Any]) -> dict[Any, Any]:
    """``values`` with every old key name replaced by its new one."""
    out = {}
    for key, value in values.items():
        new = RENAMED.get((section, key), key)
        if new != key and new in values:
            raise ConfigError(
                f"{section}.{key}: the old name of {section}.{new}, which is also given; keep one"
            )
        out[new] = value
    return out


def _build_section(name: str, values: Any) -> Any:
    cls = SECTIONS[name]
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{name}: expected a mapping of keys, got {shown(values)}")
    values = _renamed(name, values)
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {name}.{close[0]}?)" if close else ""
            raise ConfigError(f"{name}.{_name(key)}: unknown key{hint}")
        kwargs[key] = _coerce(f"{name}.{key}", value, hints[key])
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # a check comparing a value of an odd type
        raise ConfigError(f"{name}: {e}") from None


def config_from_dict(raw: Any) -> Config:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("config: expected a mapping with sections model, data, train")
    for key in raw:
        if key not in SECTIONS:
            raise ConfigError(f"{_name(key)}: unknown section (allowed: {', '.join(SECTIONS)})")
    return Config(**{name: _build_section(name, raw.get(name)) for name in SECTIONS})


def parse_overrides(pairs: list[str], flag: str = "--set") -> dict[str, dict[str, Any]]:
    """``["train.lr=3e-4", "model.position=alibi"]`` -> nested dict; the last of a key wins."""
    nested: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"{flag} {pair!r}: expected KEY=VALUE, for example train.lr=3e-4")
        key, text = pair.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) != 2 or parts[0] not in SECTIONS or not parts[1]:
            raise ConfigError(
                f"{flag} {key!r}: expected SECTION.KEY with SECTION one of {', '.join(SECTIONS)}"
            )
        if not parts[1].isidentifier():
            raise ConfigError(f"{flag} {key!r}: {_name(parts[1])} is not a config key name")
        name = RENAMED.get((parts[0], parts[1]), parts[1])
        nested.setdefault(parts[0], {})[name] = parse_value(text, f"{flag} {key.strip()}")
    return nested


def merge(base: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in overrides.items():
        current = merged.get(section)
        if current is None:
            current = {}
        if not isinstance(current, dict):
            raise ConfigError(f"{section}: expected a mapping of keys, got {shown(current)}")
        merged[section] = {**current, **values}
    return merged


def _yaml_problem(e: yaml.YAMLError) -> str:
    """Where and what: PyYAML's ``problem`` (its message's first line is often only the context,
    "while scanning for the next token"), with a tab named as the indentation mistake it is."""
    mark = getattr(e, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
    if "'\\t'" in problem:
        problem = "a tab, which YAML does not take for indentation: indent with spaces"
    return f"{where}: {problem}"


def read_yaml(path: str | Path) -> Any:
    """Safe YAML only: a Python tag (``!!python/object``) is refused, never constructed."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a config file (give a YAML file in it)")
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=ConfigLoader)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not a valid safe YAML config{_yaml_problem(e)}") from None


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, flag: str = "--set"
) -> Config:
    """The config in ``path`` (defaults when None) with ``KEY=VALUE`` overrides applied (named
    ``flag`` in an error)."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ConfigError(
            f"path: {path!r} is not a file path: give a YAML file's path (str or Path)"
        )
    if overrides is not None and not (
        isinstance(overrides, (list, tuple)) and all(isinstance(o, str) for o in overrides)
    ):
        raise ConfigError("overrides: give a list of 'KEY=VALUE' strings")
    raw = read_yaml(path) if path is not None else {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with sections model, data, train")
    # Old key names become new ones before the overrides, which use the new ones, are merged.
    raw = {
        k: _renamed(k, v) if k in SECTIONS and isinstance(v, dict) else v for k, v in raw.items()
    }
    return config_from_dict(merge(raw, parse_overrides(overrides or [], flag)))


def with_overrides(config: Config, overrides: list[str], flag: str = "--set") -> Config:
    """``config`` with ``KEY=VALUE`` overrides applied, checked as a file's are."""
    return config_from_dict(merge(config.to_dict(), parse_overrides(overrides, flag)))


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")


def flatten(config: Config) -> dict[str, Any]:
    """Every key of ``config`` by its dotted name (``model.position``), in declaration order."""
    return {f"{s}.{k}": v for s, values in config.to_dict().items() for k, v in values.items()}


def config_diff(a: Config, b: Config) -> dict[str, tuple[Any, Any]]:
    """The keys whose values differ between ``a`` and ``b``: dotted name -> (a's, b's), in
    declaration order (model, data, train), so the first entry is the first key a reader meets."""
    flat_a, flat_b = flatten(a), flatten(b)
    return {key: (flat_a[key], flat_b[key]) for key in flat_a if flat_a[key] != flat_b[key]}
