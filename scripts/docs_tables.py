"""Copy the tables of committed experiment reports into the pages that quote them (README.md and
docs/*.md), so that no table of results is typed by hand.

A page marks each quoted table:

    <!-- table: lengthgen/report.md 2 columns=position,random positions,1-8 (trained) -->
    ...
    <!-- end table -->

``lengthgen/report.md 2`` is the second Markdown table of docs/lengthgen/report.md (the report
``lm compare`` wrote); ``columns=`` keeps those columns, by header, in that order (optional). The
footnotes under a table (``[1] ...``) come with it when a kept cell cites them.

    python scripts/docs_tables.py            # rewrite the quoted tables of every docs page
    python scripts/docs_tables.py --check    # exit 1 if a page differs from its reports
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
MARK = re.compile(
    r"(<!-- table: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- end table -->)", re.DOTALL
)


def tables(report: Path) -> list[tuple[list[str], list[str]]]:
    """Each Markdown table of ``report`` as (its lines, the footnote lines right under it)."""
    lines = report.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|"):
            start = i
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            block = lines[start:i]
            notes = []
            j = i + 1 if i < len(lines) and not lines[i].strip() else i
            while j < len(lines) and re.match(r"\[\d+\] ", lines[j]):
                notes.append(lines[j])
                j += 1
            found.append((block, notes))
        else:
            i += 1
    return found


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def quote(spec: str) -> str:
    """The table ``spec`` names, as Markdown, with a line saying where it comes from."""
    parts = spec.split(" columns=")
    source, number = parts[0].rsplit(" ", 1)
    report = DOCS / source
    if not report.is_file():
        raise SystemExit(f"{report}: no such report (run the experiment that writes it)")
    found = tables(report)
    index = int(number)
    if not 1 <= index <= len(found):
        raise SystemExit(f"{report}: has {len(found)} tables, not a table {index}")
    block, notes = found[index - 1]
    rows = [cells(line) for line in block]
    if len(parts) > 1:
        wanted = [c.strip() for c in parts[1].split(",")]
        header = rows[0]
        missing = [c for c in wanted if c not in header]
        if missing:
            raise SystemExit(f"{report} table {index}: no column {missing} (it has {header})")
        keep = [header.index(c) for c in wanted]
        rows = [[row[k] for k in keep] for row in rows]
    text = "\n".join("| " + " | ".join(row) + " |" for row in rows).replace("|  |", "| |")
    cited = [n for n in notes if n.split(" ", 1)[0] in text]
    out = text + "\n"
    if cited:
        out += "\n" + "\n".join(cited) + "\n"
    return out


def refresh(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    return MARK.sub(lambda m: m.group(1) + quote(m.group("spec")) + m.group(4), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args()
    stale = []
    for page in [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = refresh(page)
        if text != page.read_text(encoding="utf-8"):
            stale.append(page)
            if not args.check:
                page.write_text(text, encoding="utf-8")
                print(page)
    if args.check and stale:
        print("stale quoted tables: " + ", ".join(map(str, stale)) + f"; run {sys.argv[0]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
