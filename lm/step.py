"""One training step, and the state the loop carries from step to step.

:class:`Stepper` runs one optimizer step (the trainer's, and ``scripts/bench.py``'s);
:class:`LoopState` is where the loop stands, the part of a checkpoint that is neither weights,
optimizer nor RNG.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from lm.distributed import World
from lm.evaluate import model_inputs
from lm.model import loss_sum
from lm.parallel import skip_gradient_sync


class Stepper:
    """One optimizer step over the micro-batches of a global batch.

    Each micro-batch's summed loss is divided by the number of real targets in the whole global
    batch (times the process count, since DDP averages gradients), so accumulated gradients are
    exactly those of one big batch. DDP or FSDP syncs gradients only on the last micro-batch.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        raw_model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        autocast: contextlib.AbstractContextManager,
        world: World,
        device: torch.device,
        grad_clip: float,
    ):
        self.model, self.raw_model, self.optimizer = model, raw_model, optimizer
        self.scaler, self.autocast, self.world, self.device = scaler, autocast, world, device
        self.clip = grad_clip if grad_clip > 0 else float("inf")
        self.params = [p for p in raw_model.parameters() if p.requires_grad]

    def forward_backward(
        self, micro_batches: list[dict[str, torch.Tensor]], n_targets: int
    ) -> torch.Tensor:
        """Accumulate gradients; returns the step's mean loss (a device scalar, not read)."""
        scale = self.world.size / n_targets
        step_loss = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro_batches):
            b = model_inputs(batch, self.device)
            last = i == len(micro_batches) - 1
            no_sync = self.world.distributed and not last
            with skip_gradient_sync(self.model) if no_sync else contextlib.nullcontext():
                with self.autocast:
                    logits = self.model(**b["inputs"])
                loss = loss_sum(logits, b["targets"], b["loss_mask"]) * scale
                self.scaler.scale(loss).backward()
            step_loss += loss.detach()
        return step_loss

    def update(self, step_loss: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Clip and apply the gradients unless something is non-finite; returns (norm, finite)."""
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        if isinstance(grad_norm, DTensor):  # FSDP: the norm over every process's shards
            grad_norm = grad_norm.full_tensor()
        # The one host-device sync per step: a NaN must be caught at the step it happens.
        finite = bool(torch.isfinite(grad_norm) & torch.isfinite(step_loss))
        if finite or self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # with fp16 the scaler itself skips an overflow
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, finite


@dataclass
class LoopState:
    """Where the loop stands: a checkpoint keeps all of it (``to_checkpoint``,
    ``from_checkpoint``) but this sitting's clock and token count."""

    interval_loss: torch.Tensor  # train loss summed over the log interval; a device scalar
    interval_steps: int = 0  # finite steps in it (kept, so a resumed run logs the same means)
    step: int = 0  # optimizer steps completed
    elapsed_before: float = 0.0  # training seconds of earlier sittings
    best_val_loss: float | None = None
    val_loss: float | None = None  # this sitting's latest evaluation
    nonfinite_skips: int = 0
    started: float = 0.0  # time.perf_counter() when this sitting's loop began
    interval_started: float = 0.0
    interval_tokens: int = 0  # target tokens of this sitting's part of the interval

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any], device: torch.device) -> LoopState:
        """From a checkpoint's ``state.json``, or a fresh start from ``{}``."""
        interval = saved.get("log_interval", {"loss_sum": 0.0, "steps": 0})
        return cls(
            interval_loss=torch.zeros((), device=device).fill_(interval["loss_sum"]),
            interval_steps=interval["steps"],
            step=saved.get("step", 0),
            elapsed_before=saved.get("elapsed_s", 0.0),
            best_val_loss=saved.get("best_val_loss"),
            nonfinite_skips=saved.get("nonfinite_skips", 0),
        )

    def to_checkpoint(self) -> dict[str, Any]:
        """The loop's entries of ``state.json`` (the step is the checkpoint's own)."""
        return {
            "elapsed_s": self.elapsed_s(),
            "best_val_loss": self.best_val_loss,
            "val_loss": self.val_loss,
            "nonfinite_skips": self.nonfinite_skips,
            "log_interval": {"loss_sum": self.interval_loss.item(), "steps": self.interval_steps},
        }

    def start_sitting(self) -> None:
        self.started = self.interval_started = time.perf_counter()

    def elapsed_s(self) -> float:
        return self.elapsed_before + (time.perf_counter() - self.started)

    def new_interval(self, now: float) -> None:
        self.interval_loss.zero_()
        self.interval_steps, self.interval_tokens, self.interval_started = 0, 0, now
