"""Training: ``loop`` (``train(config, run_dir)``), ``setup`` (a run directory made ready: a new
run, a resume, a start from another run's weights), ``step`` (one optimizer step), ``optim``
(AdamW, Muon, schedules), ``parallel`` (DDP and FSDP2), ``metrics`` and ``board`` (the logs).
``lm.train`` (:mod:`lm.api`) is its face for a notebook."""
