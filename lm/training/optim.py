"""Optimizers and learning-rate schedules.

AdamW decays matrices only (embeddings included, as GPT-2); vectors (norm gains, biases) are
not decayed. Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers") replaces each
hidden weight matrix's momentum update by the nearest semi-orthogonal matrix; embeddings, the
head, vectors and a position scheme's own parameters stay with AdamW. The schedule is a linear
warmup, then cosine, linear, constant or WSD (warmup, stable, decay: constant until the last
``decay_fraction`` of training, then linear to ``min_lr``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lm.config.sections import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule == "wsd":
        decay_start = int(cfg.max_steps * (1.0 - cfg.decay_fraction))
        if step < decay_start:
            return cfg.lr
        frac = (step - decay_start) / max(1, cfg.max_steps - decay_start)
        return cfg.lr + (cfg.min_lr - cfg.lr) * min(1.0, frac)
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    frac = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.schedule == "linear":
        return cfg.lr + (cfg.min_lr - cfg.lr) * frac
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * frac))


def build_optimizer(
    model: nn.Module, cfg: TrainConfig, device: torch.device
) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "muon":
        return _muon(model, cfg)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # The fused kernel exists for CUDA and CPU: one pass over all parameters per step.
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def _muon(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    # A position scheme's learned table or bias MLP (T5, FIRE) is no hidden layer: AdamW's.
    hidden = {
        id(p)
        for name, p in model.named_parameters()
        if ".blocks." in f".{name}" and ".position." not in name and p.dim() == 2
    }
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    matrices = [p for _, p in named if id(p) in hidden]
    others_2d = [p for _, p in named if id(p) not in hidden and p.dim() >= 2]
    vectors = [p for _, p in named if p.dim() < 2]
    groups = [
        {"params": matrices, "kind": "muon", "lr_scale": cfg.muon_lr / cfg.lr, "weight_decay": 0.0},
        {"params": others_2d, "kind": "adamw", "weight_decay": cfg.weight_decay},
        {"params": vectors, "kind": "adamw", "weight_decay": 0.0},
    ]
    return Muon(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def orthogonalize(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32):
    """Approximately ``U V^T`` of each ``g = U S V^T`` (``[..., m, n]``): a quintic Newton-Schulz
    iteration whose coefficients push every singular value towards 1 in a few steps (Jordan et
    al.); the iteration tolerates bf16, which is faster where the hardware has it."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.to(dtype).reshape(-1, *g.shape[-2:])  # [batch, m, n]
    wide = x.shape[-2] <= x.shape[-1]
    if not wide:
        x = x.mT  # iterate on the smaller Gram matrix
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)  # singular values <= 1: the basin
    for _ in range(steps):
        gram = x @ x.mT
        # x <- a x + (b gram + c gram^2) x, each scaled sum fused into its matmul's output
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x if wide else x.mT).to(g.dtype).reshape(g.shape)


def _fast_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and getattr(torch.cpu, "_is_avx512_bf16_supported", bool)()


class Muon(torch.optim.Optimizer):
    """Muon for groups with ``kind="muon"``, AdamW for the rest, in one optimizer (one state).

    Like PyTorch's fused AdamW it reads an optional ``found_inf`` attribute (a device scalar,
    1.0: skip): the step then leaves every parameter and every state tensor as it was, decided
    on the device, so the caller never waits for the flag.
    """

    def __init__(self, groups: list[dict], lr: float, betas: tuple[float, float],
                 momentum: float = 0.95, eps: float = 1e-8):  # fmt: skip
        super().__init__(groups, {"lr": lr, "betas": betas, "momentum": momentum, "eps": eps})

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch loads it, then each AdamW step count moved beside its parameter (torch keeps
        a loaded step count on the CPU), once here rather than at every step."""
        super().load_state_dict(state_dict)
        for p, state in self.state.items():
            if "step" in state:
                state["step"] = state["step"].to(p.device, _step_dtype(p.device))

    @torch.no_grad()
    def step(self, closure=None):
        found_inf = getattr(self, "found_inf", None)
        skip = None if found_inf is None else found_inf.bool()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if group["kind"] == "muon":
                self._muon_updates(params, group, skip)
            else:
                self._adamw_updates(params, group, skip)

    def _muon_updates(self, params: list[torch.Tensor], group: dict, skip) -> None:
        # Each tensor op runs once per list (torch._foreach_*), not once per matrix.
        momentum, lr, decay = group["momentum"], group["lr"], group["weight_decay"]
        grads = [p.grad for p in params]
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        new_bufs = torch._foreach_mul(bufs, momentum)
        torch._foreach_add_(new_bufs, grads)
        _assign_all(bufs, new_bufs, skip)
        nesterov = torch._foreach_add(grads, bufs, alpha=momentum)
        by_shape: dict[torch.Size, list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault(p.shape, []).append(i)
        for shape, at in by_shape.items():
            # One batched iteration per shape: every layer's matrices of that shape at once.
            mine = [params[i] for i in at]
            dtype = torch.bfloat16 if _fast_bf16(mine[0].device) else torch.float32
            updates = orthogonalize(torch.stack([nesterov[i] for i in at]), dtype=dtype)
            scale = max(1.0, shape[0] / shape[1]) ** 0.5  # same RMS whatever the aspect ratio
            new = torch._foreach_mul(mine, 1 - lr * decay) if decay else mine
            new = torch._foreach_add(new, list(updates.unbind(0)), alpha=-lr * scale)
            _assign_all(mine, new, skip)

    def _adamw_updates(self, params: list[torch.Tensor], group: dict, skip) -> None:
        states = [self.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if not state:
                state["step"] = torch.zeros((), dtype=_step_dtype(p.device), device=p.device)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
        beta1, beta2 = group["betas"]
        lr, decay = group["lr"], group["weight_decay"]
        grads = [p.grad for p in params]
        steps = torch._foreach_add([s["step"] for s in states], 1)  # 0-d each
        exp_avgs = torch._foreach_lerp([s["exp_avg"] for s in states], grads, 1 - beta1)
        exp_avg_sqs = torch._foreach_mul([s["exp_avg_sq"] for s in states], beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        corrections = []  # 1 - beta ** step, for each beta
        for beta in (beta1, beta2):
            correction = torch._foreach_pow(beta, steps)
            torch._foreach_neg_(correction)
            torch._foreach_add_(correction, 1)
            corrections.append(correction)
        denoms = torch._foreach_div(exp_avg_sqs, corrections[1])
        torch._foreach_sqrt_(denoms)
        torch._foreach_add_(denoms, group["eps"])
        moves = torch._foreach_div(exp_avgs, corrections[0])
        torch._foreach_mul_(moves, -lr)
        new = torch._foreach_mul(params, 1 - lr * decay) if decay else params
        new = torch._foreach_addcdiv(new, moves, denoms)
        _assign_all([s["exp_avg"] for s in states], exp_avgs, skip)
        _assign_all([s["exp_avg_sq"] for s in states], exp_avg_sqs, skip)
        _assign_all([s["step"] for s in states], steps, skip)
        _assign_all(params, new, skip)


def _step_dtype(device: torch.device) -> torch.dtype:
    """float64, so that the bias corrections are computed as Python floats would be (MPS has
    no float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _assign_all(
    targets: list[torch.Tensor], values: list[torch.Tensor], skip: torch.Tensor | None
) -> None:
    """Each ``target`` becomes its ``value``, or stays itself where the device flag ``skip`` is
    set (decided on the device: the host never reads it)."""
    if skip is None:
        torch._foreach_copy_(targets, values)
        return
    for target, value in zip(targets, values, strict=True):
        torch.where(skip, target, value, out=target)


def step_unless_nonfinite(optimizer: torch.optim.Optimizer, finite: torch.Tensor) -> None:
    """``optimizer.step()`` when the device flag ``finite`` is set; otherwise parameters and
    optimizer state stay exactly as they were. Fused AdamW and Muon decide on the device (their
    ``found_inf`` input); any other optimizer reads the flag on the host first."""
    fused = all(g.get("fused") for g in optimizer.param_groups)
    if not isinstance(optimizer, Muon) and not fused:
        if bool(finite):  # a host sync: only optimizers without a device-side skip get here
            optimizer.step()
        return
    optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]


def without_dynamo_import() -> None:
    """Let this process build and step optimizers without importing ``torch._dynamo``.

    PyTorch wraps ``Optimizer.add_param_group``, ``zero_grad``, ``state_dict`` and
    ``load_state_dict`` so that a compiled graph does not trace them; the wrapper imports
    ``torch._dynamo`` at its first call, about 1.5 s of every run's start on a CPU (a twentieth
    of the Shakespeare recipe: docs/performance.md). The wrapper caches what it calls on the
    wrapped function; this puts the function itself there, so nothing is imported. Adam's and
    AdamW's ``step`` sets the grad mode between two graph breaks, which import it too; the step
    here sets the same grad mode without them. Graph breaks matter only to an optimizer step
    traced by a compiler, and this is for the process of ``lm train`` and ``lm compare``
    (``lm.cli``), where none is (``train.compile`` compiles the model's forward only); a
    library user's process is left alone. Where PyTorch's wrappers have another shape, this
    leaves them as they are."""
    for method in (
        torch.optim.Optimizer.add_param_group,
        torch.optim.Optimizer.zero_grad,
        torch.optim.Optimizer.state_dict,
        torch.optim.Optimizer.load_state_dict,
    ):
        wrapped = getattr(method, "__wrapped__", None)
        if wrapped is not None and method.__code__.co_name == "inner":
            wrapped.__dict__.setdefault("__dynamo_disable", wrapped)
    step = torch.optim.Adam.step
    if getattr(step, "__wrapped__", None) is not None and step.__code__.co_name == "_use_grad":
        torch.optim.Adam.step = _in_grad_mode(step.__wrapped__)


def _in_grad_mode(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` run with autograd on only for a differentiable optimizer, as PyTorch's
    ``_use_grad_for_differentiable`` runs it, without its graph breaks."""

    @functools.wraps(step)
    def step_in_grad_mode(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        before = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return step(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(before)

    return step_in_grad_mode


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
