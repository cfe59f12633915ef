"""``lm view``'s flags and command, which ``lm/cli.py`` hands on. Light to import (the command
line builds its parser from it on every start); the page's work is imported when it runs."""

from __future__ import annotations

import argparse

from lm.config.errors import LMError
from lm.config.values import checked_text

TRUST_HELP = (
    "import the run's copy of a position scheme written outside lm (its code runs: pass it only "
    "for a run you trust)"
)


def port(text: str) -> int:
    """``--port``: 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return value


def steps(text: str) -> list[int]:
    """``--steps``: checkpoints' steps, comma-separated (``100,500,2000``)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not steps such as 100,500,2000") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: a step is 0 or more")
    return values


def add_view_parser(sub: argparse._SubParsersAction, device_help: str) -> None:
    v = sub.add_parser(
        "view",
        help="one self-contained HTML page of a run's attention and position signal, or of a "
        "comparison's runs side by side; --serve recomputes it for typed text",
    )
    v.add_argument("path", help="a run directory, or a folder lm compare wrote")
    v.add_argument(
        "--prompt",
        help="the text whose attention the page shows (a comparison: default its report's prompt)",
    )
    v.add_argument("--out", help="HTML file (default: PATH/view.html)")
    v.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out even when lm view did not write it (never a run's own file)",
    )
    v.add_argument(
        "--steps",
        type=steps,
        help="a run's checkpoints to scrub through, by step (100,500,2000; default: every one, "
        "at most 8 evenly chosen); the page opens at the last",
    )
    v.add_argument(
        "--serve",
        action="store_true",
        help="serve the run's page on --host:--port instead, recomputed for typed text, until "
        "Ctrl-C (writes nothing)",
    )
    v.add_argument(
        "--host",
        default="127.0.0.1",
        help="--serve's loopback address (default 127.0.0.1; or ::1, localhost)",
    )
    v.add_argument(
        "--port", type=port, default=8000, help="--serve's port (default 8000; 0: any free one)"
    )
    v.add_argument("--device", default="auto", help=device_help)
    v.add_argument("--trust-code", action="store_true", help=TRUST_HELP)


def view_command(args: argparse.Namespace) -> int:
    """Write the page and print its path, or serve it until Ctrl-C."""
    from lm.explorer.make import write_page
    from lm.explorer.serve import serve
    from lm.runtime.device import resolve_device

    device = str(resolve_device(args.device, "--device"))
    prompt = None if args.prompt is None else checked_text(args.prompt, "--prompt")
    if not args.serve:
        print(write_page(args.path, prompt, args.out, device, args.overwrite, args.steps))
        return 0
    if args.out is not None:
        raise LMError("--out: --serve writes nothing; give one or the other")
    if args.steps is not None:
        raise LMError("--steps: --serve shows the newest checkpoint; write the page to scrub")
    serve(args.path, prompt, args.host, args.port, device)
    return 0
