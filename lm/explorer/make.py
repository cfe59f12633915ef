"""``lm view PATH``: a run's page or a comparison's, from the folder's kind, written to a file
(checked before the slow work)."""

from __future__ import annotations

from pathlib import Path

from lm.config.errors import LMError
from lm.explorer.gather import REPORT, chosen_checkpoints, compare_page, run_page
from lm.explorer.page import out_path, render, write
from lm.runs.directory import CONFIG
from lm.runs.load import load_run

PAGE = "view.html"
"""The page's default name, inside the run or comparison folder."""


def kind_of(path: Path) -> str:
    """``run`` or ``compare``; one line when the folder is neither."""
    if path.is_file():
        raise LMError(f"{path}: is a file; give a run directory or a folder lm compare wrote")
    if not path.is_dir():
        raise LMError(f"{path}: no such run or comparison")
    if (path / CONFIG).is_file():
        return "run"
    if (path / REPORT).is_file():
        return "compare"
    raise LMError(f"{path}: neither a run (no {CONFIG}) nor a comparison (no {REPORT})")


def run_name(path: Path) -> str:
    """A run's name on its page: its folder and the one above (``compare/position=rope``)."""
    return "/".join(path.resolve().parts[-2:])


def page_html(
    path: str | Path, prompt: str | None, device: str = "cpu", steps: list[int] | None = None
) -> str:
    """The page of a run (``prompt`` required; ``steps``: the checkpoints to scrub through, the
    last one shown first) or of a comparison (``prompt`` default: the report's)."""
    path = Path(path)
    if kind_of(path) == "compare":
        if steps is not None:
            raise LMError("--steps: a run's page scrubs its checkpoints; a comparison has none")
        return render(compare_page(path, prompt, device))
    if prompt is None:
        raise LMError("--prompt: a run's page needs the text whose attention to show")
    last = chosen_checkpoints(path, steps)[-1] if steps else None  # checked before the work
    run = load_run(path, last, device=device)
    return render(run_page(run, prompt, run_name(path), steps=steps))


def write_page(
    path: str | Path,
    prompt: str | None,
    out: str | Path | None = None,
    device: str = "cpu",
    overwrite: bool = False,
    steps: list[int] | None = None,
) -> Path:
    """Write the page to ``out`` (default ``PATH/view.html``); the file written. A file there
    is replaced only when lm view wrote it, or with ``overwrite`` (never a run's own file)."""
    path = Path(path)
    kind_of(path)
    target = out_path(out if out is not None else path / PAGE, overwrite=overwrite)
    return write(page_html(path, prompt, device, steps), target)
