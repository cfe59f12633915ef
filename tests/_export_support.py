"""Runs made in a blink for the export tests: a model with random weights saved as a run."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from _support import tiny_config

from lm.config.load import save_config
from lm.data.tokenizer import TextTokenizer, train_tokenizer
from lm.model.transformer import TransformerLM
from lm.runs.checkpoint import save_checkpoint
from lm.runs.directory import CONFIG, TOKENIZER

TEXT = (
    "def f(x):\n    return x + 1\n\nThe for statement iterates over the items of any sequence.\n"
    "Caf\u00e9 na\u00efve \u2014 r\u00e9sum\u00e9, \u00fcber 3 < 4 > 2; tabs\tand {braces} [1, 2]."
)


def untrained_run(
    root: Path, tokenizer: TextTokenizer | None = None, seed: int = 0, **model: Any
) -> Path:
    """A run folder holding one checkpoint of a randomly initialised model.

    Every parameter is moved well away from its initial value (biases are zero at
    initialisation; LayerNorm weights one), so a layout mistake cannot hide in a zero.
    """
    tok = tokenizer or train_tokenizer("char", [TEXT])
    cfg = tiny_config(model={"context_length": 64, **model})
    cfg = cfg.replace(model=dataclasses.replace(cfg.model, vocab_size=tok.vocab_size))
    run = root / "run"
    run.mkdir(parents=True)
    save_config(cfg, run / CONFIG)
    tok.save(run / TOKENIZER)
    torch.manual_seed(seed)
    net = TransformerLM(cfg.model)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    save_checkpoint(run, 0, net, None, {"val_loss": None}, keep=1)
    return run
