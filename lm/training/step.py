"""One training step, and the state the loop carries from step to step.

:class:`Stepper` runs one optimizer step (the trainer's, and ``scripts/bench.py``'s);
:class:`LoopState` is where the loop stands, the part of a checkpoint that is neither weights,
optimizer nor RNG.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lm.data.batches import model_inputs
from lm.model.transformer import loss_sum
from lm.runtime.distributed import World, all_reduce_min, all_reduce_sum
from lm.training.optim import step_unless_nonfinite
from lm.training.parallel import is_sharded, skip_gradient_sync


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
        # Random positions are drawn per row from its real tokens: the key mask says which.
        self.key_mask = raw_model.config.random_positions is not None
        # FSDP's gradient norm is a DTensor of every process's shards (torch.distributed.tensor
        # is imported only by a run that shards: lm.training.parallel).
        self.sharded = is_sharded(raw_model)

    def forward_backward(
        self, micro_batches: list[dict[str, torch.Tensor]], n_targets: int
    ) -> torch.Tensor:
        """Accumulate gradients; returns the step's mean loss (a device scalar, not read)."""
        scale = self.world.size / n_targets
        step_loss = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro_batches):
            b = model_inputs(batch, self.device, self.key_mask)
            last = i == len(micro_batches) - 1
            no_sync = self.world.distributed and not last
            with skip_gradient_sync(self.model) if no_sync else contextlib.nullcontext():
                with self.autocast:
                    logits = self.model(**b["inputs"])
                loss = loss_sum(logits, b["targets"], b["loss_mask"]) * scale
                self.scaler.scale(loss).backward()
            step_loss += loss.detach()
        return step_loss

    def update(self, step_loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip and apply the gradients unless something is non-finite: (norm, finite), both
        device scalars that nothing here reads, so the host never waits for the device."""
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        if self.sharded:  # the norm over every process's shards
            grad_norm = grad_norm.full_tensor()
        finite = torch.isfinite(grad_norm) & torch.isfinite(step_loss)
        # Every process must skip together; the gradient norm already agrees (gradients are
        # all-reduced), each process's own loss need not.
        finite = all_reduce_min(self.world, finite.to(torch.int32)).bool()
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # with fp16 the scaler itself skips an overflow
            self.scaler.update()
        else:
            step_unless_nonfinite(self.optimizer, finite)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, finite


def nonfinite_message(bad_step: int, step: int, kept: Path | None, distributed: bool) -> str:
    """Why training stopped at ``step`` for a NaN/inf first seen at ``bad_step``; ``kept``: the
    newest checkpoint, if any was written."""
    who = "every process" if distributed else "training"
    outcome = (
        f"the last good checkpoint ({kept.name}) is kept"
        if kept is not None
        else "no checkpoint had been written yet, so there is nothing to resume from"
    )
    return (
        f"non-finite loss or gradient at step {bad_step}; {who} stopped at step {step}, "
        f"{outcome} "
        "(set train.on_nonfinite: skip to skip such steps)"
    )


@dataclass
class LoopState:
    """Where the loop stands: a checkpoint keeps all of it (``to_checkpoint``,
    ``from_checkpoint``) but this sitting's clock and token count. The per-step counters are
    device scalars, updated without the host reading them; they are read at log, evaluation
    and checkpoint steps only."""

    interval_loss: torch.Tensor  # train loss summed over the log interval's finite steps
    interval_steps: torch.Tensor  # finite steps in it (kept, so a resumed run logs the same means)
    nonfinite_skips: torch.Tensor  # steps skipped for a NaN/inf loss or gradient, over the run
    first_nonfinite: torch.Tensor  # the first such step (1-based) of this sitting; 0: none yet
    step: int = 0  # optimizer steps completed
    elapsed_before: float = 0.0  # training seconds of earlier sittings
    best_val_loss: float | None = None
    val_loss: float | None = None  # this sitting's latest evaluation
    started: float = 0.0  # time.perf_counter() when this sitting's loop began
    interval_started: float = 0.0
    interval_tokens: int = 0  # target tokens of this sitting's part of the interval
    # Target tokens trained on since step 0, every sitting's (a checkpoint keeps the count);
    # None where a checkpoint from before the count was kept cannot say.
    tokens: int | None = 0
    threads: int = 0  # the CPU threads the math ran on when last logged (run.json: at the start)

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any], device: torch.device) -> LoopState:
        """From a checkpoint's ``state.json``, or a fresh start from ``{}``."""
        interval = saved.get("log_interval", {"loss_sum": 0.0, "steps": 0})
        count = torch.zeros((), dtype=torch.int64, device=device)
        return cls(
            interval_loss=torch.zeros((), device=device).fill_(interval["loss_sum"]),
            interval_steps=count.clone().fill_(interval["steps"]),
            nonfinite_skips=count.clone().fill_(saved.get("nonfinite_skips", 0)),
            first_nonfinite=count.clone(),
            step=saved.get("step", 0),
            elapsed_before=saved.get("elapsed_s", 0.0),
            best_val_loss=saved.get("best_val_loss"),
            tokens=saved.get("tokens", 0 if not saved.get("step") else None),
        )

    def to_checkpoint(self) -> dict[str, Any]:
        """The loop's entries of ``state.json`` (the step is the checkpoint's own)."""
        loss, steps, skips = torch.stack(
            [
                self.interval_loss.double(),
                self.interval_steps.double(),
                self.nonfinite_skips.double(),
            ]
        ).tolist()
        return {
            "elapsed_s": self.elapsed_s(),
            "best_val_loss": self.best_val_loss,
            "val_loss": self.val_loss,
            "nonfinite_skips": int(skips),
            "log_interval": {"loss_sum": loss, "steps": int(steps)},
            "tokens": self.tokens,
        }

    def record(self, step_loss: torch.Tensor, finite: torch.Tensor, count_skips: bool) -> None:
        """Account for the step just taken (``self.step`` is not yet advanced), on the device:
        a finite step's loss joins the interval; a non-finite one is counted (unless fp16's
        scaler, which skips overflows itself, is on) and the first one remembered."""
        self.interval_loss += torch.where(finite, step_loss, torch.zeros_like(step_loss))
        self.interval_steps += finite
        if count_skips:
            self.nonfinite_skips += ~finite
            first = ~finite & (self.first_nonfinite == 0)
            self.first_nonfinite.copy_(torch.where(first, self.step + 1, self.first_nonfinite))

    def start_sitting(self) -> None:
        self.started = self.interval_started = time.perf_counter()
        self.threads = torch.get_num_threads()

    def threads_changed(self) -> dict[str, int]:
        """``{"threads": n}`` where the run now computes on another count of CPU threads than
        when last logged (a sweep gave its job the cores another gave back), else nothing."""
        now = torch.get_num_threads()
        if now == self.threads:
            return {}
        self.threads = now
        return {"threads": now}

    def elapsed_s(self) -> float:
        return self.elapsed_before + (time.perf_counter() - self.started)

    def close_interval(self, world: World, grad_norm: torch.Tensor) -> dict[str, float]:
        """The log interval's numbers (mean loss over every process, tokens/s, skips, the last
        gradient norm) in one read from the device; then a new interval starts."""
        now = time.perf_counter()
        loss = all_reduce_sum(world, self.interval_loss.clone()).double() / world.size
        counts = [self.interval_steps, self.nonfinite_skips, grad_norm]
        loss, steps, skips, norm = torch.stack([loss, *(c.double() for c in counts)]).tolist()
        tok_s = self.interval_tokens / max(now - self.interval_started, 1e-9)
        self.new_interval(now)
        # An interval whose every step was skipped has no loss, and a skipped step's gradient
        # norm is not a number: null in metrics.jsonl (JSON has no NaN), not 0.0 or NaN.
        return {
            "train_loss": loss / steps if steps else None, "tokens_per_s": tok_s,
            "grad_norm": norm if math.isfinite(norm) else None, "nonfinite_skips": int(skips),
        }  # fmt: skip

    def new_interval(self, now: float) -> None:
        self.interval_loss.zero_()
        self.interval_steps.zero_()
        self.interval_tokens, self.interval_started = 0, now

    def trained(self, targets: int) -> None:
        """Count a step's target tokens (the whole global batch's, known on the host)."""
        self.interval_tokens += targets
        if self.tokens is not None:
            self.tokens += targets
