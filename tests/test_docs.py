"""The README and docs/ say what the code does: the README is a door that CI follows, every
command they show parses, the configuration page is the dataclasses', the quoted tables are the
committed reports', every link, #anchor and path exists, the notes' table names real functions,
the layout names every file in import order, the command reference names every flag, and the
imports flow one way."""

import argparse
import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lm.cli import build_parser
from lm.config.names import SCHEMES

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_the_readme_is_a_door():
    text = _text(README)
    assert len(text.splitlines()) <= 120
    assert not re.search(r"\bsitting\b|run again on|measured again", text, re.IGNORECASE)
    for needed in ("pip install", "lm train configs/default.yaml", "python -m pytest"):
        assert needed in text
    # Nothing that changes with every run: no seconds or milliseconds, minutes only roughly.
    assert not re.findall(r"\d\s*(?:s|ms|sec|seconds?)\b", text), "a timing in the README"
    for before, figure in re.findall(r"(\w+)\s+(\d[\d.]*)\s+min(?:utes?)?\b", text):
        assert before == "about", f"README: {before} {figure} minutes is not a rough figure"


def test_ci_installs_and_tests_as_the_readme_says():
    """.ci/run runs the README's install and test commands, word for word."""
    ci = {line.strip() for line in _text(ROOT / ".ci" / "run").splitlines()}
    shown = []
    for block in re.findall(r"```bash\n(.*?)```", _text(README), re.DOTALL):
        for line in block.splitlines():
            command = line.split("  #", 1)[0].strip()
            if command.startswith(("pip install", "python -m pytest")):
                shown.append(command)
    assert {c.split()[0] for c in shown} == {"pip", "python"}, shown
    for command in shown:
        assert command in ci, f".ci/run does not run the README's {command!r}"


def _shown_commands(path: Path) -> list[str]:
    """Every ``lm ...`` command in a ```bash block (continuations joined, comments dropped),
    also those run as ``python -m lm`` or under ``torchrun ... -m lm``."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", _text(path), re.DOTALL):
        for line in block.replace("\\\n", "").splitlines():  # as bash joins a continuation
            words = shlex.split(line, comments=True)
            if "-m" in words and words[words.index("-m") + 1 :][:1] == ["lm"]:
                words = ["lm", *words[words.index("-m") + 2 :]]
            if words[:1] == ["lm"]:
                commands.append(words[1:])
    return commands


# The pages with a shell block: each shows lm commands (a page without one shows none).
SHOWING = [page for page in PAGES if "```bash\n" in _text(page)]


def test_the_pages_that_show_commands_are_found():
    assert {README.name, "commands.md", "compare.md"} <= {page.name for page in SHOWING}


@pytest.mark.parametrize("page", SHOWING, ids=lambda p: p.name)
def test_every_lm_command_shown_is_accepted_by_the_parser(page, capsys):
    parser = build_parser()
    shown = _shown_commands(page)
    assert shown, f"{page.name} has a shell block but no lm command was read from it"
    for argv in shown:
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            if e.code != 0 or argv[-1:] not in (["--version"], ["--help"]):
                pytest.fail(f"{page.name}: lm {shlex.join(argv)}: {capsys.readouterr().err}")


def test_shown_commands_write_only_under_runs_or_exports():
    for page in PAGES:
        for argv in _shown_commands(page):
            for flag in ("--out",):
                if flag in argv:
                    out = argv[argv.index(flag) + 1]
                    assert out.startswith(("runs/", "exports/")), f"{page.name}: lm {argv}"


def _anchors(path: Path) -> set[str]:
    """The #anchors of a page's headings as GitHub makes them: lower case, punctuation dropped,
    spaces as hyphens, a repeated heading numbered -1, -2, ..."""
    prose = re.sub(r"```.*?```", "", _text(path), flags=re.DOTALL)  # a shell comment is no heading
    anchors, seen = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_anchors_are_made_as_github_makes_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# fp32 or bf16, SDPA (`auto`)\n## The schemes of 2024–25\n## Against the papers\n"
        "## Against the papers\n```bash\n# a comment\n```\n"
    )
    assert _anchors(page) == {
        "fp32-or-bf16-sdpa-auto",
        "the-schemes-of-202425",
        "against-the-papers",
        "against-the-papers-1",
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_and_named_path_exists(page):
    text = _text(page)
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if target.startswith(("http://", "https://")):
            continue
        linked = page.parent / target if target else page
        assert linked.exists(), f"{page.name}: link to {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{page.name}: link to {target}#{anchor}"
    for path in set(re.findall(r"`((?:lm|scripts|configs|tests)/[\w/.]+\.(?:py|sh|yaml))`", text)):
        assert (ROOT / path).exists(), f"{page.name}: {path}"


def test_the_configuration_page_is_generated_from_the_dataclasses():
    script = ROOT / "scripts" / "config_reference.py"
    done = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_quoted_tables_are_the_committed_reports():
    script = ROOT / "scripts" / "docs_tables.py"
    done = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    for page in PAGES:  # and every marked table has been filled in
        for body in re.findall(r"<!-- table: [^>]*-->\n(.*?)<!-- end table -->", _text(page), re.S):
            assert body.startswith("|"), f"{page.name}: an empty quoted table"


def test_the_positions_page_has_every_scheme_where_it_acts_and_its_class():
    rows = {}
    for line in _text(ROOT / "docs" / "positions.md").splitlines():
        code = r"`lm/model/schemes/(\w+)\.py` `(\w+)`"
        match = re.match(rf"\| `(\w+)` \| ([a-z ]+) \|.*\| {code} \|", line)
        if match:
            rows[match.group(1)] = (match.group(2), f"{match.group(3)}:{match.group(4)}")
    assert rows == {name: (row.place.value, row.code) for name, row in SCHEMES.items()}


def test_the_notes_table_names_functions_where_they_are_defined():
    page = ROOT / "docs" / "notes-to-code.md"
    rows = re.findall(
        r"^\| .* \| ((?:`(?:lm|tests)/[\w/]+\.py` (?:`[\w.]+`(?:, )?)+)) \|$", _text(page), re.M
    )
    assert len(rows) >= 14, f"{page.name}: {len(rows)} rows name a file and its functions"
    for row in rows:
        path, names = re.fullmatch(r"`([\w/.]+)` (.*)", row).groups()
        tree = ast.parse(_text(ROOT / path))
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        for name in re.findall(r"`([\w.]+)`", names):
            assert name.split(".")[-1] in defined, f"{path} defines no {name}"


LAYOUT = ROOT / "docs" / "layout.md"


def test_the_layout_has_a_line_for_every_file_and_no_other():
    """One line a file of lm/ and scripts/, its path first: a file added, renamed or removed
    fails here until its line follows."""
    block = _text(LAYOUT).split("```", 2)[1]
    named = [line.split()[0] for line in block.splitlines() if line.strip()]
    assert len(named) == len(set(named)), "a file named twice"
    files = {
        str(path.relative_to(ROOT))
        for folder in ("lm", "scripts")
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert sorted(files - set(named)) == [], "files the layout does not name"
    assert sorted(set(named) - files) == [], "the layout names files that do not exist"


def test_the_layout_lists_the_wings_in_their_import_order():
    """The page's wings, top to bottom, are the layers the import test below holds, and its file
    list runs down the same order."""
    text = _text(LAYOUT)
    order = re.search(r"top to bottom:\n\n(.+?)\n\n", text, re.DOTALL).group(1)
    said = [re.findall(r"`(\w+)`", group) for group in re.split(r"\s·\s", order)]
    assert sorted(w for group in said for w in group) == sorted(set(LAYERS) - {"__main__"})
    layers = [{LAYERS[w] for w in group} for group in said]
    assert all(len(layer) == 1 for layer in layers), f"a group of wings on two layers: {said}"
    layers = [layer.pop() for layer in layers]
    assert layers == sorted(set(layers), reverse=True), f"not from the top down: {said}"
    files = [line.split()[0] for line in text.split("```", 2)[1].splitlines() if line.strip()]
    ranks = [
        LAYERS[_wing(".".join(Path(f).with_suffix("").parts))]
        for f in files
        if f.startswith("lm/") and f not in ("lm/__init__.py", "lm/__main__.py")
    ]
    assert ranks == sorted(ranks, reverse=True), "the file list leaves the import order"


def test_lm_has_at_most_8_top_level_modules_and_none_over_700_lines():
    assert len(list((ROOT / "lm").glob("*.py"))) <= 8
    for path in (ROOT / "lm").rglob("*.py"):
        assert len(_text(path).splitlines()) <= 700, path


# A module imports only from wings below it; lm/__init__.py hands on the API's names lazily.
LAYERS = {
    "config": 0,
    "runtime": 1,
    "model": 2,
    "data": 2,
    "runs": 3,
    "schemes": 3,
    "hf": 4,
    "sample": 4,
    "evaluate": 5,
    "evaluate_heads": 5,
    "training": 6,
    "compare": 7,
    "benchmark": 8,
    "explorer": 9,
    "api": 10,
    "cli": 11,
    "__main__": 12,
}


def _wing(module: str) -> str:
    return module.split(".")[1]


def test_imports_flow_one_way_and_form_no_circle():
    edges = {}
    for path in (ROOT / "lm").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        if module == "lm":
            continue
        imported = set()
        for node in ast.walk(ast.parse(_text(path))):  # lazy and type-only imports included
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lm."):
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if a.name.startswith("lm.")}
        edges[module] = imported
        for other in imported:
            a, b = _wing(module), _wing(other)
            assert a == b or LAYERS[b] < LAYERS[a], f"{module} imports {other}, above or beside it"

    # Within a wing too, no module reaches itself again.
    def reaches(start, seen):
        for nxt in edges.get(start, ()):
            if nxt not in seen:
                seen.add(nxt)
                reaches(nxt, seen)
        return seen

    for module in edges:
        assert module not in reaches(module, set()), f"{module} is on an import circle"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """A command's flags, but for the hidden ones lm passes itself (lm compare's jobs)."""
    return {
        flag
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and action.help != argparse.SUPPRESS
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }


def test_the_command_reference_names_every_flag_of_every_command_and_no_other():
    """Each command's synopsis (the ```text blocks of docs/commands.md) names its flags; the
    flags several commands share are in the page's last list, with the commands they go to."""
    page = _text(ROOT / "docs" / "commands.md")
    named: dict[str, set[str]] = {}
    for block in re.findall(r"```text\n(.*?)```", page, re.DOTALL):
        command = None
        for line in block.splitlines():  # an indented line goes on with the command above
            command = (re.findall(r"^lm ([a-z]+)", line) or [command])[0]
            named.setdefault(command, set()).update(re.findall(r"--[a-z][a-z-]*", line))
    shared = page.split("## Flags several commands share", 1)[1]
    for flags, where in re.findall(r"^- `([^`]*)` \(([^)]*)\)", shared, re.MULTILINE):
        for command in re.findall(r"`([a-z]+)`", where):
            named.setdefault(command, set()).update(re.findall(r"--[a-z][a-z-]*", flags))
    named.setdefault("", set()).update(re.findall(r"`lm (--[a-z-]+)`", shared))
    for command, parser in _subcommands().items():
        flags = _flags(parser)
        assert sorted(flags - named.get(command, set())) == [], f"lm {command}: flags not named"
        extra = named.get(command, set()) - flags
        assert sorted(extra) == [], f"lm {command}: the page names flags it does not take"


def test_every_flag_has_help_text_and_checkpoint_says_a_name_works():
    for command, parser in _subcommands().items():
        for action in parser._actions:
            if action.option_strings and action.help in (None, ""):
                raise AssertionError(f"lm {command} {action.option_strings[0]}: no help text")
            if "--checkpoint" in action.option_strings:
                assert "name" in action.help and "folder" in action.help, (command, action.help)
