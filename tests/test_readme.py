"""The README names every module and script, and its command table agrees with ``--help``."""

import argparse
import re
from pathlib import Path

from lm.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _layout_paths() -> set[str]:
    section = README.split("## Layout", 1)[1].split("```", 2)[1]
    return set(re.findall(r"(?:lm|scripts)/[\w.]+\.(?:py|sh)", section))


def test_layout_lists_every_module_and_script_and_nothing_else():
    listed = _layout_paths()
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "lm").glob("*.py")}
    files |= {str(p.relative_to(ROOT)) for p in (ROOT / "scripts").iterdir() if p.is_file()}
    files.discard("lm/__init__.py")
    assert sorted(files - listed) == [], "files the README's layout does not name"
    assert sorted(listed - files) == [], "README layout names files that do not exist"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every long flag a parser takes, --help aside (subcommands are not flags)."""
    return {
        flag
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction)
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }


def _table_flags() -> dict[str, set[str]]:
    """The flags the README's command table names, per subcommand ("" for ``lm`` itself): those
    in each ``lm COMMAND ...`` usage of a row's first cell, and those of a row that names flags
    for several commands, ``--checkpoint NAME|PATH`` (`sample`, `eval`, `export`)."""
    section = README.split("## The commands", 1)[1]
    table = next(block for block in section.split("\n\n") if block.startswith("| command"))
    named: dict[str, set[str]] = {}
    for row in table.splitlines()[2:]:
        first = re.split(r"(?<!\\)\|", row)[1]
        for command, usage in re.findall(r"`lm ((?:[a-z]+)?)((?:[^`])*)`", first):
            if command.startswith("-"):
                command, usage = "", command + usage
            named.setdefault(command, set()).update(re.findall(r"--[a-z][a-z-]*", usage))
        shared = re.match(r"\s*`([^`]*)` \(([^)]*)\)", first)
        if shared and not shared.group(1).startswith("lm "):
            for command in re.findall(r"`([a-z]+)`", shared.group(2)):
                flags = re.findall(r"--[a-z][a-z-]*", shared.group(1))
                named.setdefault(command, set()).update(flags)
    return named


def test_the_command_table_names_every_flag_of_every_command_and_no_other():
    table = _table_flags()
    parsers = _subcommands()
    assert sorted(table) == sorted(parsers), "commands in the table and in the parser"
    for command, parser in parsers.items():
        flags = _flags(parser)
        assert sorted(flags - table[command]) == [], f"lm {command}: flags the table lacks"
        assert sorted(table[command] - flags) == [], f"lm {command}: table flags that do not exist"


def test_every_flag_has_help_text_and_checkpoint_says_a_name_works():
    for command, parser in _subcommands().items():
        for action in parser._actions:
            if action.option_strings and action.help in (None, ""):
                raise AssertionError(f"lm {command} {action.option_strings[0]}: no help text")
            if "--checkpoint" in action.option_strings:
                assert "name" in action.help and "folder" in action.help, (command, action.help)
