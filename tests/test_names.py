"""The table of position schemes (``lm.config.names.SCHEMES``) is the one place a scheme is
written: every list, check, registry, config comment and docs table agrees with its rows."""

import re
from pathlib import Path

import pytest

from lm.config.errors import ConfigError
from lm.config.names import (
    FORMULA_ON_CPU,
    NO_FLEX,
    POSITIONS,
    SCHEMES,
    SCORE_BIASES,
    Place,
)
from lm.config.sections import ModelConfig
from lm.model.schemes import SCHEME_CLASSES
from lm.model.schemes.base import Scheme

ROOT = Path(__file__).resolve().parent.parent


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_scheme_class_is_its_rows_class_and_every_row_has_one():
    assert list(SCHEME_CLASSES) == list(SCHEMES) == list(POSITIONS)
    for name, cls in SCHEME_CLASSES.items():
        module, cls_name = SCHEMES[name].code.split(":")
        assert cls.__module__ == f"lm.model.schemes.{module}" and cls.__name__ == cls_name
        assert cls.name == name and cls.row is SCHEMES[name] and cls.place is SCHEMES[name].place
    named = {c for c in _subclasses(Scheme) if "name" in c.__dict__ and c.__module__[:3] == "lm."}
    assert named == set(SCHEME_CLASSES.values())  # no scheme class without its row


def test_the_lists_are_read_from_the_rows():
    rows = SCHEMES.values()
    assert tuple(r.name for r in rows if r.place is Place.SCORES) == SCORE_BIASES
    assert tuple(r.name for r in rows if not r.flex) == NO_FLEX
    assert tuple(r.name for r in rows if r.learned_bias or r.wide_keys) == FORMULA_ON_CPU


@pytest.mark.parametrize("name", POSITIONS)
def test_each_width_a_row_needs_even_is_checked(name):
    odd = {"d_model": dict(d_model=15, n_head=3), "head_dim": dict(d_model=12, n_head=4)}
    for width in SCHEMES[name].even:
        with pytest.raises(ConfigError, match=f"model.position: {name} needs an even"):
            ModelConfig(position=name, **odd[width])
    if not SCHEMES[name].even:  # an odd width is no matter to it
        ModelConfig(position=name, d_model=9, n_head=3)


def test_the_default_config_comment_names_every_scheme_in_the_tables_order():
    text = (ROOT / "configs" / "default.yaml").read_text()
    comment = text.split("# position: one of", 1)[1].split("(", 1)[0]
    assert re.findall(r"[a-z0-9_]+", comment) == list(POSITIONS)


def test_the_configuration_page_names_every_scheme_from_its_row():
    page = (ROOT / "docs" / "configuration.md").read_text()
    table = page.split("### Position schemes", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \| ([a-z ]+) \| (yes|no) \| (yes|no) \|", table, re.M)
    expected = [
        (r.name, r.place.value, "yes" if r.learned_bias else "no", "yes" if r.flex else "no")
        for r in SCHEMES.values()
    ]
    assert rows == expected
