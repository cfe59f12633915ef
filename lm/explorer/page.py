"""The page: one HTML file holding its styles (``page.css``), its script (``page.js``) and its
data (JSON from :mod:`lm.explorer.gather`), drawn with canvas and SVG by hand. It loads nothing
from any host, so it opens from a file, offline; :class:`Page` shows it inline in Jupyter."""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

from lm.config.errors import LMError
from lm.runs.directory import check_out_dir, run_holding

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="lm view">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; {connect}
style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<link rel="icon" href="data:,">
<title>lm view: {title}</title>
<style>{css}</style>
</head>
<body class="{kind}">
<header><h1>lm view: {title}</h1><p>{subtitle}</p></header>
<div id="controls"></div>
<main id="runs"></main>
<section id="curves"></section>
<div id="tip"></div>
<script type="application/json" id="lm-data">{data}</script>
<script>{js}</script>
</body>
</html>
"""


# Inside a <script> element "</" ends it and "<!--" with "<script" make the parser read on past
# its end, swallowing the page's own script: JSON may write any character as \uXXXX, so the data
# holds no "<", ">" or "&" at all. (JSON.parse reads U+2028 and U+2029 as plain characters.)
_HIDDEN = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def _asset(name: str) -> str:
    return resources.files("lm.explorer").joinpath(name).read_text(encoding="utf-8")


def render(data: dict[str, Any], serve: bool = False) -> str:
    """The page for ``data``; ``serve``: it asks its own server for the maps of typed text
    (and may connect there alone, as its content security policy says)."""
    data = {**data, "serve": serve}
    embedded = json.dumps(data, ensure_ascii=False, separators=(",", ":")).translate(_HIDDEN)
    runs = data["runs"]
    subtitle = (
        f"prompt {json.dumps(runs[0]['prompt'], ensure_ascii=False)}, {len(runs[0]['tokens'])} "
        f"tokens" + (f"; {len(runs)} runs side by side" if len(runs) > 1 else "")
    )
    return TEMPLATE.format(
        title=html.escape(data["title"]),
        subtitle=html.escape(subtitle),
        kind="single" if data["kind"] == "run" else "compare",
        connect="connect-src 'self';" if serve else "",
        css=_asset("page.css"),
        data=embedded,
        js=_asset("page.js"),
    )


MARK = '<meta name="generator" content="lm view">'
"""How lm knows a page it wrote: this line, within the first bytes of the file."""


def out_path(path: str | Path, flag: str = "--out", overwrite: bool = False) -> Path:
    """A file the page can be written to: not a folder, under folders that are folders; new, or
    a page lm view wrote, or (``overwrite``) any file but a run's own (a file inside a run
    directory that is not an HTML page: its config, records, metrics, checkpoints ...)."""
    path = Path(path)
    if path.is_dir():
        raise LMError(f"{flag} {path}: is a folder; give a file such as {path / 'view.html'}")
    check_out_dir(path.parent, flag)
    if not path.exists() or _ours(path):
        return path
    run = run_holding(path)
    if run is not None and path.resolve().suffix.lower() not in (".html", ".htm"):
        raise LMError(
            f"{flag} {path}: a file of the run {run}, which lm view never replaces; choose "
            f"another {flag}"
        )
    if not overwrite:
        raise LMError(
            f"{flag} {path}: exists and is not a page lm view wrote; pass --overwrite to replace it"
        )
    return path


def _ours(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return MARK.encode() in f.read(1024)
    except OSError:
        return False


def write(text: str, path: Path, flag: str = "--out") -> Path:
    """Write the page; one line when the place cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise LMError(f"{flag} {path}: cannot be written ({e.strerror})") from None
    return path


class Page:
    """A page, shown inline by Jupyter (in a frame of its own, so that its styles and script
    touch nothing else of the notebook); ``.html`` is the page, ``.save(path)`` writes it."""

    def __init__(self, text: str):
        self.html = text

    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        return write(self.html, out_path(path, "path", overwrite), "path")

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width: 100%; '
            'height: 900px; border: 1px solid #d0d7de" sandbox="allow-scripts"></iframe>'
        )
