"""The README's layout section names every module and script, and only files that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _layout_paths() -> set[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Layout", 1)[1].split("```", 2)[1]
    return set(re.findall(r"(?:lm|scripts)/[\w.]+\.(?:py|sh)", section))


def test_layout_lists_every_module_and_script_and_nothing_else():
    listed = _layout_paths()
    files = {str(p.relative_to(ROOT)) for p in (ROOT / "lm").glob("*.py")}
    files |= {str(p.relative_to(ROOT)) for p in (ROOT / "scripts").iterdir() if p.is_file()}
    files.discard("lm/__init__.py")
    assert sorted(files - listed) == [], "files the README's layout does not name"
    assert sorted(listed - files) == [], "README layout names files that do not exist"
