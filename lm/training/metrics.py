"""``metrics.jsonl``: the run's log, one JSON object per line, each with its ``step``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lm.training.board import Board


class MetricsLog:
    """``metrics.jsonl``: appended, one line per record, flushed at once so a crash loses none."""

    def __init__(
        self, path: Path, enabled: bool, keep_through_step: int | None, board: Board | None = None
    ):
        self.path, self.enabled, self.board = path, enabled, board  # board: each record too
        if not enabled:
            self.file = None
            return
        if keep_through_step is not None and path.exists():
            # Resuming: lines written after the checkpoint belong to the lost steps; drop them.
            kept = [
                line
                for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip() and _step_of(line) <= keep_through_step
            ]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(tmp, path)
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the run

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        if self.board is not None:
            self.board.write(record)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.board is not None:
            self.board.close()


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", -1))
    except (ValueError, AttributeError):
        return -1
