"""Write docs/configuration.md from the config's own dataclasses: every key of every section with
its type, default and meaning, the meaning being the key's docstring in lm/config/sections.py.

    python scripts/config_reference.py            # rewrite docs/configuration.md
    python scripts/config_reference.py --check    # exit 1 if the page differs from the code

The test suite runs the check, so the page and the code cannot drift apart.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lm.config.load import RENAMED, SECTIONS  # noqa: E402
from lm.config.names import SCHEMES, readers  # noqa: E402

PAGE = ROOT / "docs" / "configuration.md"
SOURCE = ROOT / "lm" / "config" / "sections.py"

INTRO = """# Configuration

A config is a YAML file with three sections, `model`, `data` and `train`
(`configs/*.yaml`). Every key below may be left out (its default applies) and may be set on
the command line with a dotted name, `--set train.lr=3e-4 model.position=alibi`, which goes
through the same checks as the file. Unknown keys, wrong types and impossible combinations are
refused when the config loads, in one line that names the key (exit status 2). `null` and
leaving a key out are the same.

This page is generated from `lm/config/sections.py` by `python scripts/config_reference.py`;
a test holds it equal to the code.
"""


def field_docs(cls_name: str) -> dict[str, str]:
    """Each field's docstring (the string literal after its annotation), by field name."""
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    docs, last = {}, None
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            last = node.target.id
        elif (
            last
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[last] = " ".join(node.value.value.split())
            last = None
        else:
            last = None
    return docs


def type_text(annotation: str) -> str:
    return annotation.replace(" | None", " or null").replace("list[str]", "list of names")


def default_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def readers_text(key: str) -> str:
    """`` Read by xpos only.`` after the meaning of a key only some schemes read (their rows'
    ``keys``, the one place that says so)."""
    names = readers(key)
    if not names:
        return ""
    return f" Read by {(', '.join(names[:-1]) + ' or ') if names[1:] else ''}{names[-1]} only."


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    parts = [INTRO]
    for name, cls in SECTIONS.items():
        docs = field_docs(cls.__name__)
        parts.append(f"## `{name}`\n\n{' '.join(cls.__doc__.split())}\n")
        rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            if f.name not in docs:
                raise SystemExit(f"{SOURCE}: {name}.{f.name} has no docstring")
            rows.append(
                f"| `{f.name}` | {cell(type_text(str(f.type)))} | "
                f"`{cell(default_text(f.default))}` | {cell(docs[f.name] + readers_text(f.name))} |"
            )
        parts.append("\n".join(rows) + "\n")
        if name == "model":
            parts.append(schemes_table())
    renamed = [f"`{s}.{old}` is read as `{s}.{new}`" for (s, old), new in RENAMED.items()]
    parts.append(
        "## Older names\n\nRun directories and configs written by earlier versions load: "
        + "; ".join(renamed)
        + ".\n"
    )
    return "\n".join(parts)


def schemes_table() -> str:
    """Every ``model.position``, from its row of ``lm.config.names.SCHEMES``."""
    rows = [
        "### Position schemes\n",
        "Every `model.position` (formulas and papers: [positions](positions.md)), from its row in "
        "`lm/config/names.py`:\n",
        "| `model.position` | acts on | learned bias | `kernel: flex` | even widths | "
        "keys it reads |",
        "|---|---|---|---|---|---|",
    ]
    for row in SCHEMES.values():
        even = ", ".join(row.even) or "-"
        learned, flex = ("yes" if row.learned_bias else "no"), ("yes" if row.flex else "no")
        keys = ", ".join(f"`{key}`" for key in row.keys) or "-"
        rows.append(f"| `{row.name}` | {row.place.value} | {learned} | {flex} | {even} | {keys} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} differs from lm/config/sections.py: run {sys.argv[0]}")
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(PAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
