"""The training loop: ``train(config, run_dir)``.

One code path for CPU, one GPU and many (``torchrun``): the global batch of a step is a fixed
set of sequences, split over processes and gradient-accumulation micro-batches, and the loss is
the sum over real target tokens divided by their count in the whole global batch. So one process
with accumulation, or several processes without, compute the same loss and gradients as one
big batch. Checkpoints hold everything a resumed run needs to continue on the same curve: the
weights, the optimizer, the RNG and the loop's own :class:`LoopState`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from lm.config.errors import ConfigError
from lm.config.sections import Config
from lm.data.batches import TrainBatches
from lm.data.sources import PreparedData, prepare_data, print_to_stderr
from lm.evaluate import eval_draws, evaluate
from lm.evaluate_heads import evaluation_record
from lm.model.kernels import flex_backward
from lm.model.masks import masks, positions
from lm.model.transformer import TransformerLM
from lm.runs.checkpoint import (
    CheckpointError,
    FullState,
    latest_checkpoint,
    load_optimizer,
    load_weights,
    read_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from lm.runs.code import read_run_config
from lm.runs.directory import (
    CONFIG,
    METRICS,
    PROVENANCE,
    TOKENIZER,
    RunLock,
    refuse_overlap,
    write_run_record,
)
from lm.runtime.device import (
    DTYPES,
    auto_rule,
    autocast_context,
    compile_enabled,
    resolve_device,
    resolve_dtype,
)
from lm.runtime.distributed import (
    World,
    barrier,
    check_same_resume,
    close_world,
    flagged_rank,
    init_world,
    shared_failure,
)
from lm.runtime.host import StopSignals, resident_mb, retain_freed_host_memory
from lm.training.board import check_board, open_board
from lm.training.metrics import MetricsLog
from lm.training.optim import build_optimizer, lr_at, set_lr
from lm.training.parallel import gather_full_state, is_sharded, load_full_state, wrap_model
from lm.training.setup import (
    check_has_optimizer,
    check_resumable,
    clear_run,
    init_weights_from,
    record_init_from,
    refuse_to_clobber,
    resume_checkpoint,
    short_validation,
    with_vocab,
)
from lm.training.step import LoopState, Stepper, nonfinite_message


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    """Optimizer steps completed."""
    status: str
    """done | target (reached train.target_loss) | interrupted | nonfinite | checkpoint_failed."""
    val_loss: float | None
    best_val_loss: float | None
    elapsed_s: float
    message: str = ""


def train(
    config: Config,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    init_from: str | Path | None = None,
) -> TrainResult:
    """Train ``config`` into ``run_dir``; see the module docstring. Returns how it ended.

    ``init_from``: a run whose newest weights a fresh run starts from (a resumed run keeps its
    own); ``lm.runs.config_for_init`` makes the config fit them first.
    """
    run_dir = Path(run_dir)
    refuse_overlap(run_dir, {"--init-from": init_from})  # before anything is touched
    check_board(config.train.tensorboard)
    device, world = _device_and_world(config)
    lock = RunLock(run_dir)
    threads = torch.get_num_threads()  # this run's own count, given back afterwards
    net = state = None
    try:
        torch.set_num_threads(_threads(config.train.threads, threads, world, quiet))
        run = _prepare_run(config, run_dir, device, world, lock, resume, overwrite, quiet)
        run = dataclasses.replace(run, init_from=None if run.checkpoint else init_from)
        run, dtype, chosen = _dtype_and_kernel(run)
        net = _build(run, dtype, chosen)
        # Every check passed (config, data, batches, model): only now is anything written.
        _record(run, net, clear=run.checkpoint is None and (overwrite or resume))
        state = _restore(run, net)
        status, message = _loop(run, net, state)
        result = _finish(run, state, status, message)
        barrier(world)  # every process has stopped: none leaves another mid-collective
        return result
    finally:
        torch.set_num_threads(threads)
        lock.release()
        # The model goes before the process group: DDP's reducer holds the group, and a group
        # freed last, by the reducer, joins Gloo's threads after the other process has gone
        # (a hang seen at exit under load).
        net = state = None
        gc.collect()
        close_world(world)


@dataclass(frozen=True)
class _Run:
    """What stays fixed while the loop runs."""

    config: Config  # as trained: model.vocab_size filled in from the tokenizer
    run_dir: Path
    device: torch.device
    world: World
    quiet: bool
    data: PreparedData
    checkpoint: Path | None  # the one this run resumes from; None: a fresh start
    saved: dict[str, Any]  # its state.json; empty for a fresh start
    init_from: Path | str | None = None  # a run whose weights a fresh start begins from

    def log(self, message: str) -> None:
        _log(self.world, self.quiet, message)


@dataclass(frozen=True)
class _Net:
    """The network and what trains it."""

    raw_model: TransformerLM  # not compiled nor DDP-wrapped (FSDP shards it in place)
    model: torch.nn.Module  # DDP-wrapped or sharded, then compiled, as configured: what runs
    eval_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: contextlib.AbstractContextManager
    stepper: Stepper
    batches: TrainBatches
    dtype: torch.dtype  # autocast's (float32: none)
    chosen: dict[str, dict[str, str]]  # how auto chose the dtype and kernel (run.json's ``ran``)


def _device_and_world(config: Config) -> tuple[torch.device, World]:
    """This process's device, and its place among ``torchrun``'s processes if any."""
    device = resolve_device(config.train.device)
    if device.type == "cpu":
        retain_freed_host_memory()
    world = init_world(device.type, config.train.dist_timeout_s)
    if device.type == "cuda" and world.distributed:
        device = torch.device("cuda", world.local_rank)
    return device, world


def _prepare_run(
    config: Config,
    run_dir: Path,
    device: torch.device,
    world: World,
    lock: RunLock,
    resume: bool,
    overwrite: bool,
    quiet: bool,
) -> _Run:
    """Claim ``run_dir``, find the checkpoint to resume from, prepare the data, write the record."""
    config.train.accumulation(world.size)  # the batch numbers divide, or one line says not
    dtype = resolve_dtype(config.train.dtype, device, config.model)
    if config.train.parallel == "fsdp" and dtype == torch.float16:  # as TrainConfig says for fp16
        raise ConfigError(
            f"train.dtype: auto is fp16 on this {device.type} (no bf16), which cannot run sharded "
            "(train.parallel: fsdp); set train.dtype: fp32, or parallel: ddp"
        )
    if world.is_main:
        # The lock first: a live writer is the first thing a second process must hear of.
        run_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        refuse_to_clobber(run_dir, resume, overwrite)
        if resume:  # a damaged newest checkpoint is moved aside before any process looks
            resume_checkpoint(run_dir, lambda line: _log(world, quiet, line))
    barrier(world)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None:
        _log(world, quiet, f"lm: {run_dir} has no complete checkpoint yet; starting fresh")
    step = int(checkpoint.name.rsplit("_", 1)[-1]) if checkpoint is not None else None
    own = (run_dir / CONFIG).read_bytes() if checkpoint and (run_dir / CONFIG).is_file() else b""
    check_same_resume(world, step, json.dumps(config.to_dict(), sort_keys=True).encode() + own)
    saved: dict[str, Any] = {}
    if checkpoint is not None:  # check what a resume needs before any slow work
        saved = read_state(checkpoint)
        check_has_optimizer(run_dir, checkpoint, saved)
        check_resumable(read_run_config(run_dir), config)
        trained_on = saved.get("world_size", 1)
        if trained_on != world.size:  # TrainBatches: the global batch does not depend on it
            _log(world, quiet, (
                f"lm: note: {run_dir} trained on {trained_on} process{'es' * (trained_on > 1)} "
                f"and resumes on {world.size}: every step trains on the same global batch, "
                "split otherwise, so the losses match an uninterrupted run to float rounding, "
                "not bit for bit (with dropout, less: its random masks differ)"
            ))  # fmt: skip

    # Data: the main process tokenizes (or finds the cache) first, the others then read it.
    own_tokenizer = run_dir / TOKENIZER if checkpoint is not None else None
    if world.is_main:
        log = None if quiet else print_to_stderr
        data = prepare_data(config.data, tokenizer_path=own_tokenizer, log=log)
    barrier(world)
    if not world.is_main:
        data = prepare_data(config.data, tokenizer_path=own_tokenizer, log=None)
    config = with_vocab(config, data.tokenizer)
    if (warning := short_validation(config, data.val.n_tokens)) is not None:
        _log(world, quiet, warning)
    return _Run(config, run_dir, device, world, quiet, data, checkpoint, saved)


RESUMED_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}
"""run.json's names of the dtypes a CPU run resumes with where ``train.dtype`` is ``auto``."""


def _dtype_and_kernel(run: _Run) -> tuple[_Run, torch.dtype, dict[str, dict[str, str]]]:
    """The dtype and kernel the run trains with: what the config names, else a resume's own (what
    it trained with, whatever the rule says now), else :func:`lm.runtime.device.auto_rule`'s; and
    how each left to ``auto`` was chosen (run.json's ``dtype_choice`` and ``kernel_choice``). The
    kernel goes into the run's config, so that its config.yaml records the one that ran, and
    evaluation, sampling and a resume run it too."""
    config, model = run.config, run.config.model
    dtype, kernel, resumed = config.train.dtype, model.kernel, set()
    if run.checkpoint is not None:
        trained = RESUMED_DTYPES.get(_trained_dtype(run.run_dir) or "")
        if dtype == "auto" and run.device.type == "cpu" and trained:
            dtype, resumed = trained, {"dtype_choice"}
        if kernel == "auto" and (run.run_dir / CONFIG).is_file():
            trained = read_run_config(run.run_dir).model.kernel
            if trained in ("sdpa", "math"):
                kernel, resumed = trained, {*resumed, "kernel_choice"}
    dtype, kernel, why = auto_rule(dtype, kernel, model, run.device)
    chosen = {
        name: {"value": value, "how": "resumed", "why": "what it trained with"}
        if name in resumed
        else {"value": value, "how": "rule", "why": why}
        for name, asked, value in (
            ("dtype_choice", config.train.dtype, dtype),
            ("kernel_choice", model.kernel, kernel),
        )
        if asked == "auto"
    }
    config = config.replace(model=dataclasses.replace(model, kernel=kernel))
    return dataclasses.replace(run, config=config), DTYPES[dtype], chosen


def _build(run: _Run, dtype: torch.dtype, chosen: dict[str, dict[str, str]]) -> _Net:
    """The model as ``train.seed`` initialises it, its optimizer, and what runs its steps."""
    tc, device, world, data = run.config.train, run.device, run.world, run.data
    torch.manual_seed(tc.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    raw_model = TransformerLM(run.config.model).to(device)
    if run.init_from is not None:
        init_weights_from(raw_model, run.init_from, data.tokenizer)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    model = wrap_model(raw_model, tc, world, device, dtype)
    optimizer = build_optimizer(raw_model, tc, device)  # after sharding: on the shards
    autocast = autocast_context(device, dtype)
    stepper = Stepper(model, raw_model, optimizer, scaler, autocast, world, device, tc.grad_clip)
    batches = TrainBatches(
        data.train, run.config.data, run.config.model.context_length, tc.batch_size,
        tc.accumulation(world.size), data.tokenizer.pad_id, tc.seed, rank=world.rank,
        world_size=world.size,
    )  # fmt: skip
    # On CPU a compiled evaluation would cost more than it saves: Inductor builds a second graph
    # (no autograd) and a third for the shorter last batch, tens of seconds each.
    eval_model = raw_model if device.type == "cpu" else model
    if run.checkpoint is None:
        padded = run.config.data.mode == "padded"
        run.log(
            f"lm: {raw_model.num_parameters() / 1e6:.2f}M parameters, "
            f"{run.config.model.position_text} positions, "
            f"{device.type} {str(dtype).replace('torch.', '')}, {world.size} process(es), "
            f"{data.train.n_tokens:,} training tokens"
            + (f", {batches.padding_fraction:.1%} padding" if padded else "")
        )
    if run.config.model.kernel == "flex" and not flex_backward(device):
        run.log(
            f"lm: note: model.kernel: flex has no backward pass on {device.type} in this "
            "PyTorch, so training steps use sdpa's masks; evaluation uses flex"
        )
    if chosen:  # what auto picked, and why
        values = ", ".join(f"{SETTINGS[k]} {c['value']}" for k, c in chosen.items())
        whys = dict.fromkeys(f"{c['how']}: {c['why']}" for c in chosen.values())
        run.log(f"lm: auto: {values} ({'; '.join(whys)})")
    return _Net(
        raw_model, model, eval_model, optimizer, scaler, autocast, stepper, batches, dtype, chosen
    )


SETTINGS = {"dtype_choice": "train.dtype", "kernel_choice": "model.kernel"}


def _trained_dtype(run_dir: Path) -> str | None:
    """The autocast dtype run.json says the run last trained with (its latest resume's, else
    its start's), or None where it does not say."""
    try:
        record = json.loads((run_dir / PROVENANCE).read_text(encoding="utf-8"))
        resumes = record.get("resumes", [])
        sittings = [record.get("ran") or {}, *(r.get("ran") or {} for r in resumes)]
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    said = [s.get("dtype") for s in sittings if isinstance(s, dict) and s.get("dtype")]
    return said[-1] if said else None


def _threads(asked: int | None, default: int, world: World, quiet: bool) -> int:
    """The CPU threads this run's math uses: ``train.threads``, at most the cores this process
    may run on (more would only take turns on them), said in a note when cut."""
    if asked is None:
        return default
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cores and asked > cores:
        _log(world, quiet, f"lm: note: train.threads={asked} is more than the {cores} cores "
             f"this process may use; it runs on {cores}")  # fmt: skip
        return cores
    return asked


def _ran(run: _Run, net: _Net) -> dict[str, Any]:
    """What this sitting runs on, as resolved from the config's choices and the machine: the
    device, the autocast dtype, the attention kernel of a training step, the CPU threads and
    whether the model is compiled (run.json's ``ran``, and each resume's)."""
    model, data = run.config.model, run.config.data
    ids = torch.zeros(1, model.context_length, dtype=torch.long, device=run.device)
    key_mask = torch.ones_like(ids, dtype=torch.bool) if data.mode == "padded" else None
    segments = torch.zeros_like(ids) if data.document_mask else None
    with torch.enable_grad():  # the kernel is each window's mask's
        where = positions(model, ids, key_mask, segments, training=True)
        mask = next(iter(masks(model, where, key_mask, segments, training=True).values()))
    return {
        "device": str(run.device),
        "dtype": str(net.dtype).removeprefix("torch."),
        **({"dtype_choice": net.chosen["dtype_choice"]} if "dtype_choice" in net.chosen else {}),
        "kernel": mask.kernel,
        **({"kernel_choice": net.chosen["kernel_choice"]} if "kernel_choice" in net.chosen else {}),
        "threads": torch.get_num_threads(),
        "compile": compile_enabled(run.config.train.compile, run.device),
    }


def _record(run: _Run, net: _Net, clear: bool) -> None:
    """Write the run's record (the main process): config.yaml, tokenizer.json and run.json for a
    fresh start, after clearing what an earlier run there left (``clear``: --overwrite, or
    --resume with no checkpoint); a resume's changes appended to run.json."""
    if not run.world.is_main:
        return
    if clear:
        clear_run(run.run_dir)
    resumed = run.saved["step"] if run.checkpoint is not None else None
    write_run_record(run.run_dir, run.config, run.data.tokenizer, _ran(run, net), resumed)
    if run.init_from is not None:
        record_init_from(run.run_dir, run.init_from)


def _restore(run: _Run, net: _Net) -> LoopState:
    """The one place a checkpoint is read back: weights, optimizer, RNG, scaler, loop state."""
    if run.checkpoint is not None and is_sharded(net.raw_model):
        load_full_state(net.raw_model, net.optimizer, run.checkpoint, run.saved)
    elif run.checkpoint is not None:
        load_weights(net.raw_model, run.checkpoint)
        load_optimizer(net.optimizer, run.checkpoint, run.saved)
    if run.checkpoint is not None:
        set_rng_state(run.saved["rng"])
        if "scaler" in run.saved and net.scaler.is_enabled():
            net.scaler.load_state_dict(run.saved["scaler"])
        run.log(f"lm: resuming {run.run_dir} from {run.checkpoint.name}")
    return LoopState.from_checkpoint(run.saved, run.device)


def _write_checkpoint(run: _Run, net: _Net, state: LoopState) -> None:
    """The one place a checkpoint is written (by the main process only; under FSDP every
    process first takes part in gathering the full state)."""
    model: torch.nn.Module | FullState | None = net.raw_model
    if is_sharded(net.raw_model):
        model = gather_full_state(net.raw_model, net.optimizer, run.world)
    if not run.world.is_main or model is None:
        return
    entries = {
        "rng": rng_state(),
        **state.to_checkpoint(),
        "data": {"next_step": state.step, "cache": str(run.data.cache_path)},
        "world_size": run.world.size,
    }
    if net.scaler.is_enabled():
        entries["scaler"] = net.scaler.state_dict()
    keep = run.config.train.keep_checkpoints
    save_checkpoint(run.run_dir, state.step, model, net.optimizer, entries, keep)


def _loop(run: _Run, net: _Net, state: LoopState) -> tuple[str, str]:
    """Train until ``max_steps``, the target loss, a stop signal or a failure: (status, message).

    A step reads nothing back from the device. Only at log, evaluation and checkpoint steps does
    the host wait for it: there non-finite steps, signals and failed writes are heard, by every
    process alike, so that all of them stop together.
    """
    tc = run.config.train
    keep_through = state.step if run.checkpoint is not None else None
    board = open_board(tc.tensorboard, run.run_dir, run.config, run.world.is_main, keep_through)
    metrics = MetricsLog(run.run_dir / METRICS, run.world.is_main, keep_through, board)
    bar = tqdm(
        total=tc.max_steps, initial=state.step, disable=run.quiet or not run.world.is_main,
        file=sys.stderr, dynamic_ncols=True, mininterval=0.5, desc="train",
    )  # fmt: skip
    net.model.train()
    state.start_sitting()
    with StopSignals() as signals, contextlib.closing(metrics), bar:
        status, message = _steps(run, net, state, metrics, bar, signals)
        # The log's last line says how this sitting ended, whatever the reason.
        end = {"step": state.step, **_clock(state), "status": status}
        metrics.write({**end, "message": message} if message else end)
    return status, message


def _steps(
    run: _Run, net: _Net, state: LoopState, metrics: MetricsLog, bar: tqdm, signals: StopSignals
) -> tuple[str, str]:
    """The loop itself, from ``state.step`` on: (status, message)."""
    tc = run.config.train
    while state.step < tc.max_steps:
        lr = lr_at(state.step, tc)
        set_lr(net.optimizer, lr)
        micro_batches, n_targets = net.batches.step(state.step)
        step_loss = net.stepper.forward_backward(micro_batches, n_targets)
        grad_norm, finite = net.stepper.update(step_loss)
        state.record(step_loss, finite, count_skips=not net.scaler.is_enabled())
        state.step += 1
        state.trained(n_targets)
        bar.update(1)
        step = state.step
        last = step == tc.max_steps
        log = step % tc.log_every == 0 or last
        evaluate_now = (tc.eval_every and step % tc.eval_every == 0) or last
        periodic = tc.checkpoint_every and step % tc.checkpoint_every == 0
        if not (log or evaluate_now or periodic):
            continue
        signalled = flagged_rank(run.world, signals.received is not None, run.device)
        bad_step = int(state.first_nonfinite.item())
        if bad_step and tc.on_nonfinite == "stop":
            kept = latest_checkpoint(run.run_dir)
            return "nonfinite", nonfinite_message(bad_step, step, kept, run.world.distributed)
        if log:
            _log_train(run, state, metrics, bar, lr, grad_norm)
        reached = bool(evaluate_now) and _evaluate(run, net, state, metrics, bar)
        if periodic or last or signalled is not None or reached:
            failure = _save_everywhere(run, net, state)
            if failure and (tc.on_checkpoint_error == "stop" or last):
                return "checkpoint_failed", failure
            if failure:
                run.log(f"lm: {failure}; training goes on (on_checkpoint_error: continue)")
        if signalled is not None:
            who = f" on rank {signalled}" if run.world.distributed else ""
            return "interrupted", (
                f"stopped by a signal{who} at step {step}; checkpoint saved, --resume goes on"
            )
        if reached:
            val = state.val_loss
            return "target", f"reached val_loss {val:.4f} <= {tc.target_loss} at step {step}"
    return "done", ""


def _save_everywhere(run: _Run, net: _Net, state: LoopState) -> str | None:
    """Write a checkpoint; every process gets the same answer: None, or why it failed."""
    try:
        _write_checkpoint(run, net, state)
    except CheckpointError as e:
        return shared_failure(run.world, str(e), run.device, f"checkpoint at step {state.step}")
    return shared_failure(run.world, None, run.device, f"checkpoint at step {state.step}")


def _clock(state: LoopState) -> dict[str, float]:
    return {"elapsed_s": round(state.elapsed_s(), 4)}


def _log_train(
    run: _Run, state: LoopState, metrics: MetricsLog, bar: tqdm, lr: float, grad_norm: torch.Tensor
) -> None:
    """A training line: the interval's mean loss over all processes, throughput, memory."""
    interval = state.close_interval(run.world, grad_norm)
    loss, tok_s = interval["train_loss"], interval["tokens_per_s"]
    # The keys in the order metrics.jsonl has always had them.
    record = {"step": state.step, **_clock(state), "train_loss": loss, "lr": lr, **interval}
    counted = {} if state.tokens is None else {"tokens": state.tokens}  # since step 0
    metrics.write({**record, "rss_mb": resident_mb(), **counted, **state.threads_changed()})
    shown = "skipped" if loss is None else f"{loss:.4f}"
    bar.set_postfix(loss=shown, lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}")


def _evaluate(run: _Run, net: _Net, state: LoopState, metrics: MetricsLog, bar: tqdm) -> bool:
    """Validation loss now, logged; returns whether it reached ``train.target_loss``."""
    tc, ctx, pad_id = run.config.train, run.config.model.context_length, run.data.tokenizer.pad_id
    loss, _ = evaluate(
        net.eval_model, run.data.val, run.config.data, ctx, tc.eval_batch(),
        pad_id, run.device, net.autocast, tc.eval_steps, run.world,
        eval_draws(run.config, "val", ctx),
    )  # fmt: skip
    state.val_loss = loss
    state.best_val_loss = loss if state.best_val_loss is None else min(state.best_val_loss, loss)
    scores = {}
    if tc.head_scores:  # no_grad, and seeded apart: the training numbers stay as they were
        scores = evaluation_record(
            net.raw_model, net.eval_model, run.config, run.data.tokenizer, run.data.val,
            run.device, net.autocast, run.world,
        )  # fmt: skip
    metrics.write({"step": state.step, **_clock(state), "val_loss": loss, **scores})
    if not bar.disable:
        bar.write(f"step {state.step}: val_loss {loss:.4f}", file=sys.stderr)
    return tc.target_loss is not None and loss <= tc.target_loss


def _finish(run: _Run, state: LoopState, status: str, message: str) -> TrainResult:
    elapsed = round(state.elapsed_s(), 4)
    if status in ("done", "target"):
        val = "no evaluation ran" if state.val_loss is None else f"val_loss {state.val_loss:.4f}"
        run.log(f"lm: {status} at step {state.step} in {elapsed:.1f}s; {val}")
    return TrainResult(
        run.run_dir, state.step, status, state.val_loss, state.best_val_loss, elapsed, message
    )


def _log(world: World, quiet: bool, message: str) -> None:
    if world.is_main and not quiet:
        print(message, file=sys.stderr, flush=True)
