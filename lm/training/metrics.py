"""``metrics.jsonl``: the run's log, one JSON object per line, each with its ``step``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lm.config.errors import LMError
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
            kept = [r for r in read_metrics(path) if r.get("step", -1) <= keep_through_step]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
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


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of a ``metrics.jsonl`` (none if there is no file). A last line cut short,
    which is what a kill during a write leaves, is read past; any other line that is not a JSON
    object (damaged, or bytes that are not UTF-8) is one LMError naming the file and the line."""
    if not path.is_file():
        return []
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise LMError(f"{path}: cannot be read ({e.strerror})") from None
    lines = raw.split(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif number < len(lines):  # a line that ended: damaged, not cut short
            raise LMError(
                f"{path}: line {number} is not a JSON record; the file is damaged (a run's "
                "metrics.jsonl holds one JSON object per line)"
            )
    return records
