"""What a report measures of one run, and the measurement kept with the run.

:func:`measure_run` loads a finished run and measures what the report shows: its logged losses
and throughput, its validation loss at each evaluation length (default 1x, 2x and 4x the
trained context; by ``lm.evaluate.evaluate_lengths``, the code behind ``lm eval``), a greedy
continuation of a prompt and, for a generated task, its exact-match accuracy.

The costly part (the model's losses, answers and continuation) is kept in the run's folder,
``RUN/measured.json``, under what decides it: the checkpoint measured (its name, size and
time), the :class:`Measure` settings, torch's version and a digest of lm's own code. A report
built again (new labels, a joint report of two sweeps) reads it back instead of evaluating
again; anything else measures anew. The numbers are the same either way: a model's
evaluation does not depend on the threads it runs on (tests/test_jobs.py holds a report
measured in a sweep's jobs equal to one measured alone).

In a sweep of several jobs (``lm compare --jobs N``) each job measures its own run as soon as
it is trained (:func:`measure_job`), beside the runs still training, so the report only reads.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lm.compare.report import RunResult
from lm.config.errors import LMError
from lm.config.names import extends, task_of
from lm.config.sections import Config, DataConfig
from lm.config.values import parse_rope_scaling
from lm.data.tasks import TaskSettings, evaluation_examples
from lm.evaluate import evaluate_lengths, is_task, load_with_rope_scaling, task_accuracy
from lm.runs.checkpoint import latest_checkpoint, read_state
from lm.runs.code import read_run_config
from lm.runs.directory import METRICS, PROVENANCE, TOKENIZER
from lm.sample import generate
from lm.training.metrics import read_metrics

DEFAULT_PROMPT = "The for statement"
EXTRAPOLATION = ("1x", "2x", "4x")
"""Default evaluation lengths: multiples of the trained context."""
DEFAULT_MAX_NEW_TOKENS = 80
MEASURED = "measured.json"
KEEP = 8
"""Measurements kept per run (one per setting: a RoPE run measured with several extensions)."""


@dataclass(frozen=True)
class Evaluation:
    """How a report measures its runs (``lm compare``'s evaluation flags)."""

    eval_lengths: list[str] | None = None
    """Evaluation lengths (``2x``, ``256``); None: :data:`EXTRAPOLATION`."""
    rope_scalings: list[str] | None = None
    """RoPE extensions every run that takes one (``lm.config.names.extends``: rope, xpos) is
    measured with (``none``: as trained); None: as trained."""
    eval_batches: int | None = None
    """Batches per length; None: the whole validation split."""
    prompt: str | None = None
    """The prompt each run continues; None: one of the task for a task run, else
    :data:`DEFAULT_PROMPT`."""
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS

    def given(self, **flags: Any) -> Evaluation:
        """These settings, with each flag that was given (not None) in place of its own."""
        return dataclasses.replace(self, **{k: v for k, v in flags.items() if v is not None})

    def measures(self, config: Config, prompt: str, device: str) -> list[Measure]:
        """The measurements of one run of ``config``: one per RoPE extension for a RoPE run
        when ``rope_scalings`` are given, else one, as trained."""
        variants: list[str | None] = [None]
        if self.rope_scalings is not None and extends(config.model.layer_positions):
            variants = list(self.rope_scalings)
        return [
            Measure(
                prompt,
                self.max_new_tokens,
                self.eval_batches,
                self.eval_lengths,
                variant,
                device,
            )
            for variant in variants
        ]


@dataclass(frozen=True)
class Measure:
    """The settings of one measurement of a run."""

    prompt: str
    max_new_tokens: int
    eval_batches: int | None
    lengths: list[str] | None
    rope_scaling: str | None
    """A RoPE extension in place of the run's own; None: as trained."""
    device: str


def report_prompt(evaluation: Evaluation, data: DataConfig) -> str:
    """The prompt a report's runs continue: the one given, else for a task one of the task at
    its longest trained length, else :data:`DEFAULT_PROMPT`."""
    if evaluation.prompt is not None:
        return evaluation.prompt
    task = task_of(data.source)
    if task is None:
        return DEFAULT_PROMPT
    length = data.task_ranges()[0][-1]
    return evaluation_examples(task, length, 1, data.seed, TaskSettings.of(data))[0][0]


def _tokens_seen(config: Config, step: int, records: list[dict[str, Any]]) -> tuple[int, bool]:
    """Training tokens (targets) consumed: exact for packed windows (every slot is a real token)
    and where metrics.jsonl counted them at the run's step (``tokens``), else, for a run trained
    before that count was logged, summed from each logged interval's throughput times its
    duration."""
    if config.data.mode == "packed":
        return step * config.train.batch_size * config.model.context_length, True
    counted = [r["tokens"] for r in records if "tokens" in r and r.get("step") == step]
    if counted:
        return int(counted[-1]), True
    total, before = 0.0, 0.0
    for r in records:
        if "tokens_per_s" in r:
            total += r["tokens_per_s"] * (r["elapsed_s"] - before)
            before = r["elapsed_s"]
    return round(total), False


def measure_run(
    run_dir: Path, measure: Measure, log: Callable[[str], None] | None = None
) -> tuple[RunResult, bool]:
    """Everything the report shows of one run, and whether it was read back from the run's
    ``measured.json`` rather than measured now (then kept there, ``log`` told first)."""
    cfg = read_run_config(run_dir)  # as trained; the report compares these
    measure = _as_measured(measure, cfg)
    rope_scaling = measure.rope_scaling
    key = _key(run_dir, measure)
    kept = _read_kept(run_dir).get(key) if key is not None else None
    found = kept is not None
    if kept is None:
        if log is not None:
            how = "" if rope_scaling is None else f" with rope_scaling {rope_scaling}"
            log(f"compare: evaluating {run_dir}{how}")
        kept = _measure_model(run_dir, cfg, measure)
        if key is not None:
            _keep(run_dir, key, kept)
    records = read_metrics(run_dir / METRICS)
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    elapsed = [r["elapsed_s"] for r in records if "elapsed_s" in r]
    tokens, exact = _tokens_seen(cfg, kept["step"], records)
    result = RunResult(
        run_dir=run_dir,
        config=cfg,
        parameters=kept["parameters"],
        step=kept["step"],
        tokens_seen=tokens,
        tokens_exact=exact,
        final_val_loss=vals[-1] if vals else None,
        best_val_loss=min(vals) if vals else None,
        tokens_per_s=statistics.median(speeds) if speeds else None,
        wall_s=elapsed[-1] if elapsed else None,
        extrapolation=kept["extrapolation"],
        continuation=kept["continuation"],
        tokenizer_sha256=hashlib.sha256((run_dir / TOKENIZER).read_bytes()).hexdigest(),
        data_cache=kept["data_cache"],
        eval_batches=measure.eval_batches,
        metrics=records,
        prompt_unknown=kept["prompt_unknown"],
        rope_scaling=rope_scaling,
        accuracy=kept["accuracy"],
    )
    return result, found


def _as_measured(measure: Measure, cfg: Config) -> Measure:
    """``measure`` as it is made of a run of ``cfg``: a RoPE run asked for its own extension is
    measured as trained."""
    wanted = measure.rope_scaling
    own = extends(cfg.model.layer_positions) and wanted is not None
    if own and parse_rope_scaling(wanted) == parse_rope_scaling(cfg.model.rope_scaling):
        return dataclasses.replace(measure, rope_scaling=None)
    return measure


def _measure_model(run_dir: Path, cfg: Config, measure: Measure) -> dict[str, Any]:
    """What only the model can say: losses by length, the continuation, a task's accuracy."""
    device, start = measure.device, time.perf_counter()
    run = load_with_rope_scaling(run_dir, device=device, rope_scaling=measure.rope_scaling)
    # A task's loss is measured at its trained context only: its examples are shorter, and what
    # it says about longer ones is its accuracy.
    task = is_task(cfg)
    default = ["1x"] if task else list(EXTRAPOLATION)
    rows = evaluate_lengths(
        run, run_dir, measure.lengths or default, device=device, max_batches=measure.eval_batches
    )
    tok = run.tokenizer
    prompt_ids = tok.encode(measure.prompt) or [tok.eod_id]
    new = generate(run.model, [prompt_ids], measure.max_new_tokens, tok.pad_id, tok.eod_id)[0]
    return {
        "parameters": run.model.num_parameters(),
        "step": run.step,
        "extrapolation": rows,
        "continuation": tok.decode(new),
        "prompt_unknown": tok.count_unknown(measure.prompt),
        "data_cache": read_state(run.checkpoint).get("data", {}).get("cache"),
        "accuracy": task_accuracy(run, device) if task else None,
        # How it was measured, for the reader: the numbers do not depend on it.
        "threads": torch.get_num_threads(),
        "seconds": round(time.perf_counter() - start, 2),
    }


def measure_job(run_dir: Path, spec: str, threads: int | None = None) -> None:
    """A sweep job's measurement of the run it trained (its job worker's ``--measure``,
    :mod:`lm.compare.worker`): ``spec`` is the JSON of :func:`job_spec`; on ``threads`` CPU
    threads (default: those the run trained on)."""
    try:
        given = json.loads(spec)
        evaluation = Evaluation(**given["evaluation"])
        prompt, device = given["prompt"], given["device"]
    except (ValueError, TypeError, KeyError):
        raise LMError(f"--measure: {spec!r} is not what lm compare passes its jobs") from None
    cfg = read_run_config(run_dir)
    # The cores the job trained on (run.json says) or was last given, not the machine's: other
    # jobs may be training beside it.
    before = torch.get_num_threads()
    if threads is None:
        try:
            ran = json.loads((run_dir / PROVENANCE).read_text(encoding="utf-8"))["ran"]
            threads = max(1, int(ran["threads"]))
        except (OSError, ValueError, KeyError, TypeError):
            threads = before  # the job's own default, then
    torch.set_num_threads(threads)
    try:
        for measure in evaluation.measures(cfg, prompt, device):
            measure_run(run_dir, measure)
    finally:
        torch.set_num_threads(before)


def job_spec(evaluation: Evaluation, prompt: str, device: str) -> str:
    """The ``--measure`` value telling a sweep's job how the report measures its run. A job on
    a GPU sees its own device as ``cuda``."""
    device = "cuda" if device.startswith("cuda") else device
    record = {"evaluation": dataclasses.asdict(evaluation), "prompt": prompt, "device": device}
    return json.dumps(record)


# The measurement kept with the run


@functools.cache
def code_digest() -> str:
    """A digest of lm's own source: a measurement made by other code is made again."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _key(run_dir: Path, measure: Measure) -> str | None:
    """What decides a measurement, as one string; None when the run has no checkpoint."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return None
    files = sorted(p for p in checkpoint.iterdir() if p.name.startswith("model"))
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    key = {
        "checkpoint": checkpoint.name,
        "files": stats,
        "measure": dataclasses.asdict(measure),
        "torch": torch.__version__,
        "lm": code_digest(),
    }
    return json.dumps(key, sort_keys=True)


def _read_kept(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The run's kept measurements by key; a file that is missing or damaged keeps none."""
    try:
        entries = json.loads((run_dir / MEASURED).read_text(encoding="utf-8"))["entries"]
        return {e["key"]: e["measured"] for e in entries}
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError):
        return {}


def _keep(run_dir: Path, key: str, measured: dict[str, Any]) -> None:
    """Add a measurement to the run's file (the newest :data:`KEEP`), replaced whole; best
    effort: a file that cannot be written costs the next report a measurement."""
    kept = _read_kept(run_dir)
    kept.pop(key, None)
    kept[key] = measured
    entries = [{"key": k, "measured": v} for k, v in list(kept.items())[-KEEP:]]
    path = run_dir / MEASURED
    try:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"entries": entries}, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
