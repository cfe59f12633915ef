"""The training loop: ``train(config, run_dir)``.

One code path for CPU, one GPU and many (``torchrun``): the global batch of a step is a fixed
set of sequences, split over processes and gradient-accumulation micro-batches, and the loss is
the sum over real target tokens divided by their count in the whole global batch. So one process
with accumulation, or several processes without, compute the same loss and gradients as one
big batch. Checkpoints hold everything a resumed run needs to continue on the same curve.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from lm.batches import TrainBatches
from lm.board import Board, open_board
from lm.checkpoint import (
    CHECKPOINTS,
    CheckpointError,
    latest_checkpoint,
    load_optimizer,
    load_weights,
    read_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from lm.config import (
    Config,
    ConfigError,
    LMError,
    ModelConfig,
    TrainConfig,
    load_config,
    save_config,
)
from lm.data import PreparedData, prepare_data, print_to_stderr
from lm.distributed import World, all_reduce_sum, barrier, broadcast_flag, close_world, init_world
from lm.evaluate import evaluate, model_inputs
from lm.model import TransformerLM, loss_sum
from lm.optim import build_optimizer, lr_at, set_lr
from lm.runs import CONFIG, METRICS, PROVENANCE, TOKENIZER, RunLock, init_weights_from, provenance

# Test hook: make the loss of this step non-finite, to exercise train.on_nonfinite.
INJECT_NONFINITE_ENV = "LM_INJECT_NONFINITE_AT_STEP"


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


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda requested but no CUDA device is available")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("train.device: mps requested but MPS is not available")
    return torch.device(name)


def retain_freed_host_memory() -> bool:
    """Keep freed CPU memory in the process for the next step instead of returning it to the OS.

    glibc's malloc hands big freed blocks back to the kernel (unmapping them, or trimming the heap),
    so each step's activations come back as fresh pages the kernel must fault in and zero: 966
    page faults a step at nanoGPT's CPU shape, against 34 with the settings below, and a step
    about 5% shorter (README, scripts/bench.py --malloc-default). A step then reuses the memory
    the previous one freed; the peak is unchanged. Returns whether the C library took the
    settings (glibc does; others have no ``mallopt``).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    # Blocks up to 1 GiB come from the heap (bigger ones are mapped), and the heap is never
    # trimmed: with a 1 GiB trim threshold GPT-2 small still faulted in ~470k pages a step.
    mapped = mallopt(m_mmap_threshold, 1 << 30)
    return bool(mapped) and bool(mallopt(m_trim_threshold, -1))  # -1: never trim


def compile_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``torch.compile``; on CPU with Inductor's C++ wrapper, which calls the generated kernels
    from C++ instead of one Python line per kernel, an overhead that weighs on small CPU steps.
    At nanoGPT's CPU shape a step takes 29.7 ms compiled against 32.4 eager (README,
    scripts/throughput_vs_nanogpt.py --compile). Compiling takes seconds to a minute and needs a
    C++ compiler, as any Inductor build on CPU does; so ``train.compile: auto`` stays eager there.
    """
    if device.type != "cpu":
        return torch.compile(model)
    compilers = [os.environ.get("CXX") or "g++", "clang++"]
    if not any(shutil.which(c) for c in compilers):
        raise ConfigError(
            f"train.compile: compiling on CPU needs a C++ compiler and none of "
            f"{', '.join(compilers)} is on PATH (set CXX, or train.compile: false)"
        )
    return torch.compile(model, options={"cpp_wrapper": True})


# Measured on an AVX-512-BF16/AMX CPU (scripts/bench.py): bf16 autocast is 1.3x slower than fp32
# at width 128 (nanoGPT's CPU shape) and 1.8x faster at width 384 (its GPU Shakespeare shape).
CPU_BF16_MIN_WIDTH = 384


def resolve_dtype(name: str, device: torch.device, model: ModelConfig) -> torch.dtype:
    """The autocast dtype (float32 = no autocast)."""
    if name == "fp32":
        return torch.float32
    if name == "bf16":
        return torch.bfloat16
    if name == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        fast_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        if fast_bf16 and model.d_model >= CPU_BF16_MIN_WIDTH:
            return torch.bfloat16
    return torch.float32


def autocast_context(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class Stepper:
    """One optimizer step over the micro-batches of a global batch.

    Each micro-batch's summed loss is divided by the number of real targets in the whole global
    batch (times the process count, since DDP averages gradients), so accumulated gradients are
    exactly those of one big batch. DDP syncs gradients only on the last micro-batch.
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
        self, micro_batches: list[dict[str, torch.Tensor]], n_targets: int, poison: bool = False
    ) -> torch.Tensor:
        """Accumulate gradients; returns the step's mean loss (a device scalar, not read)."""
        scale = self.world.size / n_targets
        step_loss = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro_batches):
            b = model_inputs(batch, self.device)
            last = i == len(micro_batches) - 1
            no_sync = self.world.distributed and not last
            with self.model.no_sync() if no_sync else contextlib.nullcontext():
                with self.autocast:
                    logits = self.model(**b["inputs"])
                loss = loss_sum(logits, b["targets"], b["loss_mask"]) * scale
                if poison:  # the fault-injection hook of the tests
                    loss = loss * float("nan")
                self.scaler.scale(loss).backward()
            step_loss += loss.detach()
        return step_loss

    def update(self, step_loss: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Clip and apply the gradients unless something is non-finite; returns (norm, finite)."""
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        # The one host-device sync per step: a NaN must be caught at the step it happens.
        finite = bool(torch.isfinite(grad_norm) & torch.isfinite(step_loss))
        if finite or self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # with fp16 the scaler itself skips an overflow
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, finite


class _StopSignals:
    """SIGINT/SIGTERM ask the loop to save a checkpoint and stop at the next step boundary."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if _in_main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class MetricsLog:
    """``metrics.jsonl``: appended, one line per record, flushed at once so a crash loses none."""

    board: Board | None = None  # TensorBoard event files, given every record too

    def __init__(self, path: Path, enabled: bool, keep_through_step: int | None):
        self.path, self.enabled = path, enabled
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


def _prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber a run: nothing in ``run_dir`` changes unless the user asked."""
    existing = latest_checkpoint(run_dir)
    has_run = existing is not None or (run_dir / METRICS).exists()
    if has_run and not (resume or overwrite):
        where = f"checkpoint {existing.name}" if existing is not None else "metrics.jsonl"
        raise LMError(
            f"{run_dir} already holds a run ({where}); pass --resume to continue it "
            "or --overwrite to start again"
        )


def _clear_run(run_dir: Path) -> None:
    shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
    for name in (METRICS, CONFIG, TOKENIZER, PROVENANCE, "eval.json"):
        (run_dir / name).unlink(missing_ok=True)


def _check_resumable(saved: Config, config: Config) -> None:
    """Resuming may change the train section (e.g. more steps), not the model or the data."""
    for section in ("model", "data"):
        a, b = saved.to_dict()[section], config.to_dict()[section]
        for key in a:
            if key == "vocab_size" and section == "model" and b[key] is None:
                continue
            if a[key] != b[key]:
                raise ConfigError(
                    f"{section}.{key}: the run was trained with {a[key]!r}, this config says "
                    f"{b[key]!r}; resume with the run's config ({CONFIG})"
                )


def _with_vocab(config: Config, data: PreparedData) -> Config:
    vocab = data.tokenizer.vocab_size
    stated = config.model.vocab_size
    if stated is not None and stated != vocab:
        raise ConfigError(
            f"model.vocab_size: the config says {stated} but the tokenizer has {vocab} tokens "
            "(leave model.vocab_size out; it comes from the tokenizer)"
        )
    return config.replace(model=dataclasses.replace(config.model, vocab_size=vocab))


def _log(world: World, quiet: bool, message: str) -> None:
    if world.is_main and not quiet:
        print(message, file=sys.stderr, flush=True)


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

    ``init_from``: a run whose newest weights a fresh run starts from (not a resumed one).
    """
    run_dir = Path(run_dir)
    tc: TrainConfig = config.train
    device = resolve_device(tc.device)
    if device.type == "cpu":
        retain_freed_host_memory()
    world = init_world(device.type)
    if device.type == "cuda" and world.distributed:
        device = torch.device("cuda", world.local_rank)
    try:
        if tc.batch_size % (tc.grad_accum * world.size):
            raise ConfigError(
                f"train.batch_size: {tc.batch_size} is not divisible by grad_accum "
                f"({tc.grad_accum}) x processes ({world.size})"
            )
        lock = RunLock(run_dir)
        try:
            if world.is_main:
                # The lock first: a live writer is the first thing a second process must hear of.
                run_dir.mkdir(parents=True, exist_ok=True)
                lock.acquire()
                _prepare_run_dir(run_dir, resume, overwrite)
            barrier(world)
            return _train(config, run_dir, device, world, resume, overwrite, quiet, init_from)
        finally:
            lock.release()
    finally:
        close_world(world)


def _train(
    config: Config,
    run_dir: Path,
    device: torch.device,
    world: World,
    resume: bool,
    overwrite: bool,
    quiet: bool,
    init_from: str | Path | None = None,
) -> TrainResult:
    tc = config.train
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if resume and checkpoint is None:
        _log(world, quiet, f"lm: {run_dir} has no complete checkpoint yet; starting fresh")
    if checkpoint is not None:  # check what a resume needs before any slow work
        state = read_state(checkpoint)
        saved = load_config(run_dir / CONFIG)
        _check_resumable(saved, config)
    elif world.is_main and (overwrite or resume):
        _clear_run(run_dir)  # a fresh start: no lines of an earlier attempt stay in the log

    # Data: the main process tokenizes (or finds the cache) first, the others then read it.
    own_tokenizer = run_dir / TOKENIZER if checkpoint is not None else None
    if world.is_main:
        log = None if quiet else print_to_stderr
        data = prepare_data(config.data, tokenizer_path=own_tokenizer, log=log)
    barrier(world)
    if not world.is_main:
        data = prepare_data(config.data, tokenizer_path=own_tokenizer, log=None)
    config = _with_vocab(config, data)
    if world.is_main:
        save_config(config, run_dir / CONFIG)
        data.tokenizer.save(run_dir / TOKENIZER)
        (run_dir / PROVENANCE).write_text(json.dumps(provenance(), indent=2) + "\n")

    torch.manual_seed(tc.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = TransformerLM(config.model).to(device)
    if init_from is not None and checkpoint is None:  # a resumed run has weights of its own
        init_weights_from(model, init_from, run_dir if world.is_main else None)
    optimizer = build_optimizer(model, tc, device)
    dtype = resolve_dtype(tc.dtype, device, config.model)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    start_step, elapsed_before, best_val, skipped = 0, 0.0, None, 0
    if checkpoint is not None:
        load_weights(model, checkpoint)
        load_optimizer(optimizer, checkpoint, state)
        set_rng_state(state["rng"])
        if "scaler" in state and scaler.is_enabled():
            scaler.load_state_dict(state["scaler"])
        start_step = state["step"]
        elapsed_before = state.get("elapsed_s", 0.0)
        best_val = state.get("best_val_loss")
        skipped = state.get("nonfinite_skips", 0)
        _log(world, quiet, f"lm: resuming {run_dir} from {checkpoint.name}")

    raw_model = model
    compile_on = tc.compile == "true" or (tc.compile == "auto" and device.type == "cuda")
    if compile_on:
        model = compile_model(model, device)
    if world.distributed:
        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    autocast = autocast_context(device, dtype)
    stepper = Stepper(model, raw_model, optimizer, scaler, autocast, world, device, tc.grad_clip)

    ctx = config.model.context_length
    pad_id = data.tokenizer.pad_id
    batches = TrainBatches(
        data.train,
        config.data,
        ctx,
        tc.batch_size,
        tc.grad_accum,
        pad_id,
        tc.seed,
        rank=world.rank,
        world_size=world.size,
    )
    eval_bs = tc.eval_batch_size or tc.batch_size

    # On CPU a compiled evaluation would cost more than it saves: Inductor builds a second graph
    # (no autograd) and a third for the shorter last batch, tens of seconds each.
    eval_model = raw_model if device.type == "cpu" else model

    def run_eval() -> float:
        loss, _ = evaluate(
            eval_model,
            data.val,
            config.data,
            ctx,
            eval_bs,
            pad_id,
            device,
            autocast,
            tc.eval_steps,
            world,
        )
        return loss

    kept_step = start_step if checkpoint is not None else None
    board = open_board(tc.tensorboard, run_dir, config, world.is_main, kept_step)
    metrics = MetricsLog(run_dir / METRICS, world.is_main, kept_step)
    metrics.board = board
    n_params = raw_model.num_parameters()
    if start_step == 0:
        _log(
            world,
            quiet,
            f"lm: {n_params / 1e6:.2f}M parameters, {config.model.position} positions, "
            f"{device.type} {str(dtype).replace('torch.', '')}, {world.size} process(es), "
            f"{data.train.n_tokens:,} training tokens"
            + (f", {batches.padding_fraction:.1%} padding" if config.data.mode == "padded" else ""),
        )

    def save(step: int, val_loss: float | None) -> None:
        if not world.is_main:
            return
        state = {
            "rng": rng_state(),
            "elapsed_s": elapsed_before + (time.perf_counter() - t0),
            "best_val_loss": best_val,
            "val_loss": val_loss,
            "nonfinite_skips": skipped,
            "data": {"next_step": step, "cache": str(data.cache_path)},
            "world_size": world.size,
            # The partly filled logging interval, so the resumed run logs the same means.
            "log_interval": {"loss_sum": loss_acc.item(), "steps": steps_since_log},
        }
        if scaler.is_enabled():
            state["scaler"] = scaler.state_dict()
        save_checkpoint(run_dir, step, raw_model, optimizer, state, tc.keep_checkpoints)

    inject_at = int(os.environ.get(INJECT_NONFINITE_ENV, "-1"))
    model.train()
    t0 = time.perf_counter()
    last_log_t, tokens_since_log = t0, 0
    loss_acc = torch.zeros((), device=device)  # summed over the log interval, read at log time
    steps_since_log = 0
    if checkpoint is not None and "log_interval" in state:
        loss_acc.fill_(state["log_interval"]["loss_sum"])
        steps_since_log = state["log_interval"]["steps"]
    status, message, val_loss = "done", "", None
    step = start_step
    bar = tqdm(
        total=tc.max_steps,
        initial=start_step,
        disable=quiet or not world.is_main,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.5,
        desc="train",
    )

    with _StopSignals() as signals:
        while step < tc.max_steps:
            lr = lr_at(step, tc)
            set_lr(optimizer, lr)
            micro_batches, n_targets = batches.step(step)
            step_loss = stepper.forward_backward(micro_batches, n_targets, step == inject_at)
            grad_norm, finite = stepper.update(step_loss)
            if not finite and not scaler.is_enabled():  # (fp16 overflow: the scaler backs off)
                if tc.on_nonfinite == "stop":
                    status = "nonfinite"
                    message = (
                        f"non-finite loss or gradient at step {step + 1}; stopped, the last good "
                        f"checkpoint is kept (set train.on_nonfinite: skip to skip such steps)"
                    )
                    break
                skipped += 1
                metrics.write(
                    {
                        "step": step + 1,
                        "elapsed_s": _elapsed(elapsed_before, t0),
                        "nonfinite_skips": skipped,
                    }
                )
            elif finite:
                loss_acc += step_loss
                steps_since_log += 1
            step += 1
            tokens_since_log += n_targets
            bar.update(1)

            if step % tc.log_every == 0 or step == tc.max_steps:
                now = time.perf_counter()
                mean_loss = all_reduce_sum(world, loss_acc.clone()).item() / world.size
                mean_loss /= max(1, steps_since_log)
                tok_s = tokens_since_log / max(now - last_log_t, 1e-9)
                record = {
                    "step": step,
                    "elapsed_s": _elapsed(elapsed_before, t0),
                    "train_loss": mean_loss,
                    "lr": lr,
                    "tokens_per_s": tok_s,
                    "grad_norm": float(grad_norm),
                    "nonfinite_skips": skipped,
                    "rss_mb": resident_mb(),
                }
                metrics.write(record)
                bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}")
                loss_acc.zero_()
                steps_since_log, tokens_since_log, last_log_t = 0, 0, now

            evaluate_now = (tc.eval_every and step % tc.eval_every == 0) or step == tc.max_steps
            if evaluate_now:
                val_loss = run_eval()
                best_val = val_loss if best_val is None else min(best_val, val_loss)
                metrics.write(
                    {"step": step, "elapsed_s": _elapsed(elapsed_before, t0), "val_loss": val_loss}
                )
                if not bar.disable:
                    bar.write(f"step {step}: val_loss {val_loss:.4f}", file=sys.stderr)
                if tc.target_loss is not None and val_loss <= tc.target_loss:
                    status = "target"

            stop_signal = broadcast_flag(world, signals.received is not None, device)
            periodic = tc.checkpoint_every and step % tc.checkpoint_every == 0
            if periodic or step == tc.max_steps or stop_signal or status == "target":
                try:
                    save(step, val_loss)
                except CheckpointError as e:
                    if tc.on_checkpoint_error == "stop" or step == tc.max_steps:
                        status, message = "checkpoint_failed", str(e)
                        break
                    _log(world, quiet, f"lm: {e}; training goes on (on_checkpoint_error: continue)")
            if stop_signal:
                status = "interrupted"
                message = f"stopped by a signal at step {step}; checkpoint saved, --resume goes on"
                break
            if status == "target":
                message = f"reached val_loss {val_loss:.4f} <= {tc.target_loss} at step {step}"
                break
    bar.close()
    metrics.close()
    elapsed = _elapsed(elapsed_before, t0)
    if status in ("done", "target"):
        _log(world, quiet, f"lm: {status} at step {step} in {elapsed:.1f}s; val_loss {val_loss}")
    return TrainResult(run_dir, step, status, val_loss, best_val, elapsed, message)


def resident_mb() -> float | None:
    """This process's resident memory in MiB (Linux), logged so that growth shows."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def _elapsed(before: float, t0: float) -> float:
    return round(before + time.perf_counter() - t0, 4)
