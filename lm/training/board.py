"""TensorBoard event files beside ``metrics.jsonl``, which stays the record of truth.

Every record written to ``metrics.jsonl`` is also written here, each number as a scalar under
its own key (``train_loss``, ``val_loss``, ``lr``, ``tokens_per_s``, ...) at the record's step,
each head's score under ``heads/<score>/L<layer>H<head>`` (docs/heads.md), and the resolved
config goes to the HParams dashboard. The event files sit in the run directory itself, so
``tensorboard --logdir runs/compare`` names each run of a sweep by its folder
(``position=rope/seed1``) and overlays them all.

``train.tensorboard``: left out (null), it writes when the ``tensorboard`` package is
installed; ``true`` insists on it, ``false`` writes nothing. A resumed run hides the events its
checkpoint did not keep (``purge_step``), as ``metrics.jsonl`` drops their lines.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from lm.config.errors import ConfigError
from lm.config.load import flatten
from lm.config.sections import Config
from lm.config.values import value_text

EVENTS_GLOB = "events.out.tfevents.*"
# The HParams dashboard lists these next to each run's config; values come from the scalars.
SUMMARY_METRICS = ("val_loss", "train_loss")


def tensorboard_installed() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


class Board:
    """One run's TensorBoard writer; :meth:`write` takes the records of ``metrics.jsonl``."""

    def __init__(self, run_dir: Path, config: Config, keep_through_step: int | None):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        if keep_through_step is None:  # a fresh start: no curve of an earlier attempt stays
            for old in Path(run_dir).glob(EVENTS_GLOB):
                old.unlink(missing_ok=True)
        purge = None if keep_through_step is None else keep_through_step + 1
        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge)
        # hparams() reads only the metric names here; their values are the logged scalars.
        experiment, start, self._end = hparams(
            flat_config(config), dict.fromkeys(SUMMARY_METRICS, 0.0)
        )
        self.writer.file_writer.add_summary(experiment)
        self.writer.file_writer.add_summary(start)
        self.writer.flush()

    def write(self, record: dict[str, Any]) -> None:
        for key, value in scalars(record):
            self.writer.add_scalar(key, value, record["step"])
        self.writer.flush()  # as metrics.jsonl: a crash loses no logged step

    def close(self) -> None:
        self.writer.file_writer.add_summary(self._end)
        self.writer.close()


def scalars(record: dict[str, Any]) -> list[tuple[str, float]]:
    """A record's numbers as TensorBoard's scalars: each under its key, and each head's score
    (``heads``: {score: [layer][head]}) under ``heads/<score>/L<layer>H<head>``."""
    out = []
    for key, value in record.items():
        if key == "heads":
            out += [
                (f"heads/{score}/L{layer}H{head}", v)
                for score, table in value.items()
                for layer, row in enumerate(table)
                for head, v in enumerate(row)
            ]
        elif key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((key, value))
    return out


def flat_config(config: Config) -> dict[str, Any]:
    """``{"model.position": "rope", ...}``; booleans as words, unset keys left out."""
    words = {True: "true", False: "false"}
    return {
        k: words[v] if isinstance(v, bool) else value_text(v) if isinstance(v, list) else v
        for k, v in flatten(config).items()
        if v is not None
    }


def check_board(mode: bool | None) -> None:
    """``train.tensorboard: true`` needs the package: said before the run writes anything."""
    if mode is True and not tensorboard_installed():
        raise ConfigError(
            "train.tensorboard: true, but the tensorboard package is not installed "
            "(pip install tensorboard, or leave train.tensorboard out)"
        )


def open_board(
    mode: bool | None, run_dir: Path, config: Config, enabled: bool, keep_through_step: int | None
) -> Board | None:
    """The run's board per ``train.tensorboard`` (``mode``); None when off or not the main
    process. ``keep_through_step`` as for ``metrics.jsonl``: the checkpoint step on resume."""
    check_board(mode)
    if not enabled or mode is False or not tensorboard_installed():
        return None
    return Board(run_dir, config, keep_through_step)
