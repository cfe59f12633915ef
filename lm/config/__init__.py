"""Typed, frozen configuration: one dataclass per section, loaded from YAML.

A config file has three sections, ``model``, ``data`` and ``train``; each component receives
only its own. Every key is checked once, at load: unknown keys, wrong types and impossible
combinations raise :class:`ConfigError` with a one-line message that names the key and says
what is allowed. Command-line overrides use dotted names (``train.lr=3e-4``) and go through
the same checks as the file.

``errors`` (what a user can get wrong), ``names`` (every word a key may take), ``values`` (a
value as text), ``sections`` (the dataclasses), ``checks`` (the checks that span keys),
``load`` (YAML and overrides).
"""

from lm.config.errors import ConfigError, LMError
from lm.config.load import load_config
from lm.config.sections import Config, DataConfig, ModelConfig, TrainConfig

__all__ = [
    "Config",
    "ConfigError",
    "DataConfig",
    "LMError",
    "ModelConfig",
    "TrainConfig",
    "load_config",
]
