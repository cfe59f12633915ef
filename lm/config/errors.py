"""The errors a user can cause: each is said as one line and exit status 2 by the command line."""

from __future__ import annotations


class LMError(Exception):
    """An error caused by the user's input; the CLI prints its message as one line, exit 2."""


class SharedError(LMError):
    """An error every process of a ``torchrun`` job meets alike (they read the same command
    line, config and files, or agreed on it): rank 0 alone says it."""


class ConfigError(SharedError):
    """A config key is unknown, of the wrong type, or impossible together with another."""


class DataError(LMError):
    """The text or tokenizer a config points at cannot be used: missing, empty or malformed."""


FLAGS = {
    "overrides": "--set",
    "init_from": "--init-from",
    "checkpoint": "--checkpoint",
    "rope_scaling": "--rope-scaling",
    "prompt": "--prompt",
    "out": "--out",
}
"""How a one-line error names an argument the Python API shares with the command line: by its
flag on the command line (these), by its own name through the API (``ARGUMENTS``)."""
ARGUMENTS = {name: name for name in FLAGS}


def one_line(text: str) -> str:
    """A message as one line whatever it quotes (a file name or flag may hold a newline)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")
