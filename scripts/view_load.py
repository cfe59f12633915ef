"""How big an ``lm view`` page is and how soon a browser has drawn it: the page of RUN for a
128-character prompt, opened from its file in headless Chromium (Debian's ``chromium``, driven
by Playwright) several times, each time from navigation to the moment the page marks itself
drawn (``body[data-version]``, set once every panel is drawn).

    python scripts/view_load.py runs/default [--loads 5]

Prints the page's size and each load's milliseconds, with their median. A measurement, not a
test: the time depends on the machine and on what else runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import lm

CHROMIUM = "/usr/bin/chromium"
PROMPT = ("The with statement is used to wrap the execution of a block " * 3)[:128]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run directory")
    parser.add_argument("--loads", type=int, default=5, help="times to open the page")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    page = lm.view(args.run, PROMPT, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "view.html"
        path.write_text(page.html)
        print(f"page for a {len(PROMPT)}-character prompt: {path.stat().st_size / 1e6:.2f} MB")
        times = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            for _ in range(args.loads):
                tab = browser.new_page(viewport={"width": 1400, "height": 1000})
                tab.goto(path.as_uri())
                tab.wait_for_selector("body[data-version]")
                times.append(tab.evaluate("performance.now()"))  # ms since navigation began
                tab.close()
            browser.close()
    shown = ", ".join(f"{t:.0f}" for t in times)
    print(f"drawn after {shown} ms; median {statistics.median(times):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
