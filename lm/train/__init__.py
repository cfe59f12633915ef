"""Training: ``loop`` (``train(config, run_dir)``), ``setup`` (a run directory made ready: a new
run, a resume, a start from another run's weights), ``step`` (one optimizer step), ``optim``
(AdamW, Muon, schedules), ``parallel`` (DDP and FSDP2), ``metrics`` and ``board`` (the logs)."""

from lm.train.loop import train

__all__ = ["train"]
