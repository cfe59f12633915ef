"""``lm compare``: train runs that differ in one config key (a sweep), measure each, report.

:func:`run_sweep` trains one run per value and seed into ``DIR/<key>=<value>/seed<N>``, every
other key as the config file says. The tokenizer and token ids come from data.py's cache, keyed
by content: the first run makes them and the others find them, so all runs see the same ids.
A sweep can be run again: finished runs are reused, an interrupted one resumes.

An evaluation-time key (``--vary eval.rope_scaling=none,pi:4,ntk:4,yarn:4``) varies nothing in
training: each trained RoPE run is measured once per value, with that context extension in
place of its own; runs of the other schemes are measured once, as trained.

:mod:`lm.compare.measure` measures each finished run for the report (and keeps what it
measured with the run); ``lm.compare.report`` renders the report from those results alone.

How a folder's report measures its runs is part of the folder's record, ``sweep.json``: the runs
in their order and the :class:`Evaluation` settings, written when a sweep starts and with every
report. ``lm compare DIR`` (the report alone) reads it back, so a rebuilt report is the same
report; a flag given to the rebuild replaces its one setting.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from lm.compare.auto_jobs import auto_jobs
from lm.compare.jobs import Job, run_jobs
from lm.compare.measure import (
    MEASURED,
    Evaluation,
    job_spec,
    measure_run,
    report_prompt,
)
from lm.compare.report import HOUSEKEEPING, write_report
from lm.config.errors import ConfigError, LMError
from lm.config.load import config_diff, load_config, parse_overrides
from lm.config.names import extends, readers
from lm.config.sections import Config, TrainConfig
from lm.config.values import parse_rope_scaling, parse_value, shown, split_values
from lm.data.sources import prepare_data, print_to_stderr
from lm.runs.checkpoint import latest_checkpoint, read_state
from lm.runs.code import read_run_config
from lm.runs.directory import CONFIG, check_out_dir
from lm.runtime import choices
from lm.runtime.device import resolve_device

DEFAULT_OUT = Path("runs/compare")
EVAL_KEYS = ("eval.rope_scaling",)
"""Keys ``--vary`` may sweep at evaluation time, on the same trained runs."""
RECORD = "sweep.json"


def write_sweep_record(out_dir: Path, runs: list[Path], evaluation: Evaluation) -> None:
    """``out_dir/sweep.json``: the runs of its report in order (relative to ``out_dir`` when
    inside it) and how they are evaluated."""
    names = []
    for run in runs:
        inside = out_dir.resolve() in run.resolve().parents
        names.append(os.path.relpath(run, out_dir) if inside else str(run.resolve()))
    record = {"runs": names, **dataclasses.asdict(evaluation)}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def read_record(folder: Path) -> tuple[list[Path], Evaluation] | None:
    """The runs and evaluation settings ``folder/sweep.json`` records; None without one."""
    path = folder / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        runs = [folder / name for name in record.pop("runs")]
        return runs, Evaluation(**record)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise LMError(f"{path}: not a record lm compare wrote; delete it to rebuild") from None


def _quiet(message: str) -> None:
    pass


# The sweep


def parse_vary(text: str) -> tuple[str, list[str]]:
    """``"model.position=rope,alibi"`` -> ``("model.position", ["rope", "alibi"])``.

    A config key is checked as ``--set`` checks it, its values when the configs are built; an
    evaluation key (:data:`EVAL_KEYS`) and its values are checked here.
    """
    if "=" not in text:
        raise ConfigError(
            f"--vary {text!r}: expected KEY=VALUE,VALUE,..., for example "
            "model.position=rope,sinusoidal"
        )
    key, values = text.split("=", 1)
    key = key.strip()
    if not values.strip():
        raise ConfigError(f"--vary {key}: no values given after '='")
    texts = split_values(values, f"--vary {key}")  # a list keeps its commas: rope,[rope,none]
    if key == "train.seed":
        raise ConfigError("--vary train.seed: use --seeds to repeat runs over seeds")
    if key.startswith("eval."):
        if key not in EVAL_KEYS:
            raise ConfigError(
                f"--vary {key}: unknown evaluation key (allowed: {', '.join(EVAL_KEYS)})"
            )
        settings = [parse_rope_scaling(value, f"--vary {key}") for value in texts]
        _refuse_repeats(key, texts, settings)
        return key, texts
    settings = [value_settings(key, v) for v in texts]
    parse_overrides([s for each in settings for s in each], flag="--vary")  # keys and values
    pairs = [[s.split("=", 1) for s in each] for each in settings]
    parsed = [  # (key, value) pairs: extra settings of one value may differ by key alone
        [(k.strip(), parse_value(v, f"--vary {key}")) for k, v in each] for each in pairs
    ]
    _refuse_repeats(key, texts, parsed)
    return key, texts


_EXTRA = re.compile(r"\+(?=[A-Za-z_]+\.[A-Za-z_]+=)")
"""A ``+`` that starts another setting of the same run: ``+model.normalize=stick_breaking``."""


def value_settings(key: str, text: str) -> list[str]:
    """The ``--set`` settings of one ``--vary`` value: ``KEY=VALUE``, then any settings it joins
    with ``+`` (``none+model.normalize=stick_breaking`` is position none with stick-breaking),
    so that one sweep compares schemes that are more than one key."""
    value, *extras = _EXTRA.split(text)
    for extra in extras:
        if extra.split("=", 1)[0].strip() == key:
            raise ConfigError(f"--vary {key}: {text!r} sets {key} twice")
    return [f"{key}={value}", *extras]


def _refuse_repeats(key: str, texts: list[str], settings: list[Any]) -> None:
    """Two values that are one setting (``1e4`` and ``10000``, ``[rope,none]`` and ``[rope,
    none]``) would train one run twice: refused, naming both."""
    for i, setting in enumerate(settings):
        for j in range(i):
            if settings[j] == setting:
                raise ConfigError(
                    f"--vary {key}: {texts[j]} and {texts[i]} are the same setting; give each "
                    "value once"
                )


def split_varies(
    varies: list[str], rope_scaling: str | None = None
) -> tuple[tuple[str, list[str]] | None, list[str] | None]:
    """The ``--vary`` flags as (the config key to train over and its values, or None) and (the
    RoPE extensions to evaluate every RoPE run with, or None). ``rope_scaling`` (``--rope-scaling``)
    is one extension for all."""
    training, evaluation = [], []
    for text in varies:
        key, values = parse_vary(text)
        (evaluation if key in EVAL_KEYS else training).append((key, values))
    if len(training) > 1:
        raise ConfigError(
            f"--vary {training[0][0]} and --vary {training[1][0]}: a sweep varies one training "
            "key (run one sweep per key); an evaluation key (eval.rope_scaling) may join it"
        )
    if len(evaluation) > 1:
        raise ConfigError("--vary eval.rope_scaling: given twice")
    if rope_scaling is not None:
        parse_rope_scaling(rope_scaling, "--rope-scaling")
        if evaluation:
            raise ConfigError("--rope-scaling and --vary eval.rope_scaling: give one of them")
        evaluation = [("eval.rope_scaling", [rope_scaling])]
    return (training[0] if training else None), (evaluation[0][1] if evaluation else None)


def _run_dir(out_dir: Path, key: str | None, value: str | None, seed: int) -> Path:
    if key is None or value is None:  # one config, only its seeds
        return out_dir / f"seed{seed}"
    # A path-like value must not become nested folders, nor a list a shell pattern ([a,b]).
    value = re.sub(r"\+[A-Za-z_]+\.(?=[A-Za-z_]+=)", "+", value)  # +model.normalize= -> +normalize=
    safe = value.replace("/", "_").replace("[", "").replace("]", "").replace(" ", "")
    safe = safe.replace('"', "").replace("'", "")
    return out_dir / f"{key.split('.')[-1]}={safe}" / f"seed{seed}"


def _refuse_shared_folders(key: str, texts: list[str], folders: list[Path]) -> None:
    """Two values whose runs would share a folder (``data/a/t.txt`` and ``data/a_t.txt``) are
    refused before any training, naming both."""
    for i, folder in enumerate(folders):
        for j in range(i):
            if folders[j].parent == folder.parent:
                raise ConfigError(
                    f"--vary {key}: {texts[j]} and {texts[i]} would both train in "
                    f"{folder.parent}; run them as two sweeps, or rename one"
                )


def _refuse_other_sweep(out_dir: Path, key: str | None, planned: list[Path]) -> None:
    """A folder holding the runs of a sweep over another key is refused before any training:
    its report would count two sweeps' runs (and one config's runs under two names) as one."""
    ours = key.split(".")[-1] if key else None
    if not out_dir.is_dir():
        return
    for config in sorted(out_dir.rglob(CONFIG)):
        run = config.parent
        if run in planned or run == out_dir:
            continue
        top = run.relative_to(out_dir).parts[0]
        theirs = top.partition("=")[0] if "=" in top else None
        if theirs != ours:
            what = f"a sweep of {theirs}" if theirs else "runs of one config"
            raise LMError(
                f"--out {out_dir}: holds {what} ({run.relative_to(out_dir)}); "
                f"{'a sweep of ' + ours if ours else 'this config'} goes to another --out, so "
                "that no report counts the two as one sweep"
            )


def _finished(state: dict[str, Any], tc: TrainConfig) -> bool:
    """Trained to ``max_steps``, or stopped early because it reached ``target_loss``."""
    if state["step"] >= tc.max_steps:
        return True
    val = state.get("val_loss")
    return tc.target_loss is not None and val is not None and val <= tc.target_loss


def _check_same_config(run_dir: Path, config: Config) -> None:
    """A run folder the sweep reuses or resumes must hold the run this sweep asks for, every
    key the same: a larger ``train.max_steps`` is another run too (its schedule decays over
    more steps), never a finished run stitched onto."""
    if not (run_dir / CONFIG).is_file():
        return
    saved = read_run_config(run_dir)
    for name, (old, new) in config_diff(saved, config).items():
        if name in ("model.vocab_size", "train.threads"):  # threads: the same numbers on any
            continue
        if name == "model.kernel" and new == "auto":  # what it chose: a resume keeps it
            continue
        raise LMError(
            f"{run_dir}: was trained with {name}={shown(old)}, this sweep asks for {shown(new)}; "
            "delete that folder or choose another --out"
        )


def run_sweep(
    config_path: str | Path,
    vary_key: str | None,
    values: list[str] | None,
    seeds: list[int] | None = None,
    overrides: list[str] | None = None,
    out_dir: str | Path = DEFAULT_OUT,
    quiet: bool = False,
    evaluation: Evaluation = Evaluation(),
    jobs: int | str = 1,
    measure_device: str | None = None,
    init_from: str | Path | None = None,
) -> list[Path]:
    """Train (or reuse, or resume) one run per value and seed; returns their folders in order.

    ``vary_key`` None: the config as it is, once per seed. ``seeds`` default to the config's
    own ``train.seed``. Every config is built and checked before the first run starts, so a bad
    value fails at once, not after an hour of training. ``out_dir/sweep.json`` records the runs
    and ``evaluation`` before the first one trains, so that an interrupted sweep's report, built
    alone, is evaluated as the finished sweep's would be. ``jobs`` > 1 trains that many runs at
    once, each in its own process (:mod:`lm.compare.jobs`); with ``measure_device`` each job
    then measures its run for the report, on that device (:func:`lm.compare.measure.measure_job`).
    ``init_from``: each run of seed N starts from ``init_from/seed<N>``'s weights (checked first).
    """
    overrides = overrides or []
    out_dir = Path(out_dir)
    log = _quiet if quiet else print_to_stderr
    base = load_config(config_path, overrides)
    if seeds is None:
        seeds = [base.train.seed]
    device = resolve_device(base.train.device, "train.device")
    settings = (
        [(v, value_settings(vary_key, v)) for v in values or []] if vary_key else [(None, [])]
    )
    plan = [
        (_run_dir(out_dir, vary_key, value, seed), [*overrides, *setting, f"train.seed={seed}"])
        for value, setting in settings
        for seed in seeds
    ]
    configs = [load_config(config_path, keys) for _, keys in plan]  # every one checked first
    run_dirs = [run_dir for run_dir, _ in plan]
    if vary_key is not None:
        seen = configs[:: len(seeds)]  # each value's first seed
        _refuse_repeats(vary_key, list(values), [json.dumps(c.to_dict()) for c in seen])
        _refuse_shared_folders(vary_key, list(values), run_dirs[:: len(seeds)])
    _refuse_other_sweep(out_dir, vary_key, run_dirs)
    init = _init_sources(init_from, run_dirs, configs)
    if jobs == "auto":
        jobs = auto_jobs_of(configs, device, log)
    write_sweep_record(out_dir, run_dirs, evaluation)
    prompt = report_prompt(evaluation, configs[0].data)  # one example: cheap
    measure = None if measure_device is None else job_spec(evaluation, prompt, measure_device)
    paths = [config_path] * len(plan)
    train_plan(plan, configs, paths, jobs, base, device, quiet, log, measure, init)
    return run_dirs


def _init_sources(
    init_from: str | Path | None, run_dirs: list[Path], configs: list[Config]
) -> dict[Path, Path]:
    """Each planned run's ``--init-from`` source by its folder: ``DIR/seed<N>`` for its seed N,
    each checked as ``lm train --init-from`` checks it (a run with a checkpoint, weights that
    fit) before the first run trains; none without ``init_from``."""
    if init_from is None:
        return {}
    from lm.training.setup import config_for_init  # the model's modules: only when asked

    sources = {}
    for run_dir, config in zip(run_dirs, configs, strict=True):
        source = Path(init_from) / f"seed{config.train.seed}"
        if not source.is_dir():
            raise LMError(
                f"--init-from {init_from}: no run seed{config.train.seed} there (the run of "
                f"seed N starts from {Path(init_from) / 'seed<N>'})"
            )
        config_for_init(config, source)  # refuses what does not fit, naming it
        sources[run_dir] = source
    return sources


def auto_jobs_of(configs: list[Config], device: torch.device, log: Callable[[str], None]) -> int:
    """``--jobs auto``: the runs to train at once, decided for the sweep's runs and mean steps
    at its first config's shape by :func:`lm.compare.auto_jobs.auto_jobs` (its data prepared
    first: the model's vocabulary is the tokenizer's), and said in one line."""
    config = configs[0]
    data = prepare_data(config.data, log=None)
    vocab = data.tokenizer.vocab_size
    sized = config.replace(model=dataclasses.replace(config.model, vocab_size=vocab))
    cores = torch.get_num_threads()
    steps = round(sum(c.train.max_steps for c in configs) / len(configs))
    decided = auto_jobs(sized, device, cores, len(configs), steps, data)
    if not decided.ms:
        log(f"compare: --jobs auto: {decided.jobs} ({decided.why})")
        return decided.jobs
    when = "measured now" if decided.how == "measured" else "measured earlier"
    kept = f"kept in {choices.cache_file()}"
    if decided.not_kept:
        kept = f"not kept: {decided.not_kept}; the next sweep measures again"
    log(
        f"compare: --jobs auto: {decided.jobs} ({decided.why}; a step of one run on {cores} "
        f"threads {decided.ms['every']:.0f} ms, on one thread {decided.ms['one']:.0f} ms, "
        f"{when} on this machine, {kept})"
    )
    return decided.jobs


def train_plan(
    plan: list[tuple[Path, list[str]]],
    configs: list[Config],
    config_paths: list[str | Path],
    jobs: int,
    base: Config,
    device: torch.device,
    quiet: bool,
    log: Callable[[str], None],
    measure: str | None = None,
    init: dict[Path, Path] | None = None,
) -> None:
    """Train (or reuse, or resume) every planned run (``configs[i]``: ``config_paths[i]`` and
    ``plan[i]``'s keys; lm bench's runs are of several files), in this process or as ``jobs``
    jobs (each then measuring its run as ``measure``, a :func:`lm.compare.measure.job_spec`,
    says); a run that ``init`` maps to a run folder starts from its weights."""
    # Here, not above: a report alone never trains, and the trainer's imports (distributed
    # checkpointing among them) take seconds.
    from lm.training.loop import train

    waiting = []
    init = init or {}
    for (run_dir, keys), config, path in zip(plan, configs, config_paths, strict=True):
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is not None:
            _check_same_config(run_dir, config)
            state = read_state(checkpoint)
            if _finished(state, config.train):
                log(f"compare: {run_dir} is finished (step {state['step']}); reusing it")
                continue
            log(f"compare: resuming {run_dir} from step {state['step']}")
        elif jobs == 1:
            log(f"compare: training {run_dir}")
        if jobs > 1:
            args = _job_args(path, run_dir, checkpoint, measure, init.get(run_dir), keys)
            waiting.append((Job(run_dir, args, config.train.max_steps), config))
            continue
        _train_here(train, config, run_dir, checkpoint is not None, quiet, init.get(run_dir))
    if waiting:
        # The first run of each data config makes its tokenizer and ids; here, once, first.
        for data in {c.data: None for _, c in waiting}:
            prepare_data(data, log=None if quiet else log)
        gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        # On CPU the jobs divide the cores, unless the config fixes every run's threads.
        divide = device.type == "cpu" and base.train.threads is None
        cores = torch.get_num_threads() if divide else None
        configs_of = {job.run_dir: config for job, config in waiting}

        def here(job: Job) -> None:
            resume = latest_checkpoint(job.run_dir) is not None
            config = configs_of[job.run_dir]
            _train_here(train, config, job.run_dir, resume, quiet, init.get(job.run_dir))

        run_jobs([job for job, _ in waiting], jobs, gpus, log, cores, here)


def _job_args(
    config_path: str | Path,
    run_dir: Path,
    checkpoint: Path | None,
    measure: str | None,
    source: Path | None,
    keys: list[str],
) -> list[str]:
    """The ``lm train`` arguments of a run trained as a job (:mod:`lm.compare.worker`): it
    resumes from ``checkpoint``; without one, whatever its folder holds (a run killed before
    its first save) is cleared and training starts over."""
    args = [str(config_path), "--out", str(run_dir)]
    args += ["--resume" if checkpoint is not None else "--overwrite"]
    args += ["--measure", measure] if measure is not None else []
    args += ["--init-from", str(source)] if source is not None else []
    return [*args, "--set", *keys]


def _train_here(
    train: Callable[..., Any],
    config: Config,
    run_dir: Path,
    resume: bool,
    quiet: bool,
    init_from: Path | None = None,
) -> None:
    """Train one run of the sweep in this process (from ``init_from``'s weights, if given); an
    interruption or a failure, said in one line."""
    result = train(
        config, run_dir, resume=resume, overwrite=not resume, quiet=quiet, init_from=init_from
    )
    if result.status == "interrupted":
        raise KeyboardInterrupt(
            f"{run_dir} saved a checkpoint at step {result.step}; the same command again resumes"
        )
    if result.status not in ("done", "target"):
        raise LMError(f"{run_dir}: {result.message}")


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run folders: each path is a run (it has config.yaml) or a folder searched for runs."""
    runs: list[Path] = []
    for path in map(Path, paths):
        if (path / CONFIG).is_file():
            found = [path]
        elif path.is_dir():
            found = sorted(p.parent for p in path.rglob(CONFIG))
            if not found:
                raise LMError(f"{path}: not a run directory and holds none")
        else:
            raise LMError(f"{path}: no such run directory")
        runs.extend(r for r in found if r not in runs)
    return runs


def _check_rope(positions: Iterable[tuple[str, ...]]) -> None:
    """``positions``: each run's layer schemes; one must take a RoPE extension (as ``lm eval
    --rope-scaling`` asks: ``lm.config.names.extends``)."""
    if not any(extends(layers) for layers in positions):
        raise LMError(
            "eval.rope_scaling extends RoPE; none of the runs uses position: "
            + " or ".join(readers("rope_scaling"))
        )


def _once(configs: dict[Path, Config], log: Callable[[str], None]) -> dict[Path, Config]:
    """The runs, each config and seed once: a run that trained the same config with the same
    seed as an earlier one (two sweeps' folders for one setting) is left out, saying so."""
    kept: dict[Path, Config] = {}
    for run_dir, config in configs.items():
        same = next((d for d, c in kept.items() if _same_run(c, config)), None)
        if same is None:
            kept[run_dir] = config
        else:
            log(f"compare: {run_dir} trained the same config and seed as {same}: counted once")
    return kept


def _same_run(a: Config, b: Config) -> bool:
    """Whether two configs train the same numbers: no key differs but housekeeping."""
    ignored = {*HOUSEKEEPING, "model.vocab_size"}
    return all(name in ignored for name in config_diff(a, b))


def report(
    run_dirs: list[Path],
    out_dir: str | Path = DEFAULT_OUT,
    evaluation: Evaluation = Evaluation(),
    *,
    device: str = "cpu",
    log: Callable[[str], None] = print_to_stderr,
) -> str:
    """Measure every run as ``evaluation`` says (or read back what was measured of it with the
    same settings), write the report and its record (``sweep.json``) into ``out_dir``; return
    the Markdown.

    Every RoPE run is measured once per extension of ``evaluation.rope_scalings`` (``none``: as
    trained), the other runs once."""
    if not run_dirs:
        raise LMError("compare: no runs to report on")
    configs = _once({Path(d): read_run_config(Path(d)) for d in run_dirs}, log)
    if evaluation.rope_scalings is not None:
        _check_rope(c.model.layer_positions for c in configs.values())
    prompt = report_prompt(evaluation, next(iter(configs.values())).data)
    results, kept = [], 0
    for run_dir, config in configs.items():
        for measure in evaluation.measures(config, prompt, device):
            result, found = measure_run(run_dir, measure, log)
            kept += found
            results.append(result)
    if kept:
        log(f"compare: {kept} of {len(results)} measurement(s) read back from the runs' {MEASURED}")
    markdown = write_report(results, out_dir, prompt, evaluation.max_new_tokens)
    write_sweep_record(Path(out_dir), list(configs), evaluation)
    log(f"compare: wrote {Path(out_dir) / 'report.md'}, report.json and its pictures")
    return markdown


def _existing_runs(paths: list[str], log: Callable[[str], None]) -> tuple[list[Path], Evaluation]:
    """The runs a report of existing runs reads, and the evaluation settings a sweep folder's
    record holds (the defaults otherwise): the record's runs in order, then any others found."""
    recorded = read_record(Path(paths[0])) if len(paths) == 1 else None
    evaluation = Evaluation()
    if recorded is not None:  # the report this folder holds: its runs in order, its settings
        order, evaluation = recorded
        holds = any(Path(paths[0]).rglob(CONFIG))  # a joint report's runs live elsewhere
        found = find_runs(paths) if holds else []
        listed = [r for r in order if (r / CONFIG).is_file()]  # an interrupted sweep: not all
        runs = listed + [r for r in found if r not in listed]
        if not runs:
            raise LMError(f"{paths[0]}: its {RECORD} lists no run that exists, and it holds none")
        if len(listed) < len(order):
            log(f"compare: {len(order) - len(listed)} run(s) {RECORD} lists do not exist yet")
    else:
        runs = find_runs(paths)
    return runs, evaluation


def compare(
    paths: list[str],
    vary: list[str] | None = None,
    seeds: list[int] | None = None,
    overrides: list[str] | None = None,
    out: str | Path | None = None,
    quiet: bool = False,
    rope_scaling: str | None = None,
    *,
    eval_lengths: list[str] | None = None,
    eval_batches: int | None = None,
    prompt: str | None = None,
    max_new_tokens: int | None = None,
    device: str = "cpu",
    jobs: int | str = 1,
    init_from: str | Path | None = None,
) -> str:
    """``lm compare``: a sweep (one config file and ``vary``), then its report; or the report
    of runs that exist (run folders, or folders holding them). Returns the Markdown.

    ``vary`` holds at most one config key to train over and at most one evaluation key
    (``eval.rope_scaling``), which measures the same trained runs again without retraining;
    ``rope_scaling`` is one evaluation-time extension for every RoPE run. The evaluation flags
    left None take their defaults in a sweep, and in a report alone of one folder the settings
    its record (``sweep.json``) holds. ``init_from``: each seed N's run of a sweep starts from
    the weights of ``init_from/seed<N>`` (:func:`run_sweep`)."""
    log = _quiet if quiet else print_to_stderr
    if out is not None:
        check_out_dir(out)
    training, rope_scalings = split_varies(vary or [], rope_scaling)
    flags = {
        "eval_lengths": eval_lengths,
        "rope_scalings": rope_scalings,
        "eval_batches": eval_batches,
        "prompt": prompt,
        "max_new_tokens": max_new_tokens,
    }
    shaped = seeds is not None or bool(overrides) or jobs != 1 or init_from is not None
    if _is_sweep(paths, training is not None, rope_scalings is not None, shaped):
        key, values = training if training is not None else (None, None)
        if rope_scalings is not None:  # refused before any training, not after it
            settings = [value_settings(key, v) for v in values or []] if key else [[]]
            configs = [load_config(paths[0], [*(overrides or []), *s]) for s in settings]
            _check_rope(c.model.layer_positions for c in configs)
        out_dir = Path(out) if out is not None else DEFAULT_OUT
        evaluation = Evaluation().given(**flags)
        runs = run_sweep(
            paths[0], key, values, seeds, overrides, out_dir, quiet, evaluation, jobs, device,
            init_from,
        )  # fmt: skip
        return report(runs, out_dir, evaluation, device=device, log=log)
    runs, evaluation = _existing_runs(paths, log)
    evaluation = evaluation.given(**flags)
    return report(runs, _report_dir(paths, out, runs), evaluation, device=device, log=log)


def _is_sweep(paths: list[str], trains: bool, evaluates: bool, shaped: bool) -> bool:
    """Whether ``lm compare`` is asked for a sweep (one config file, a key to vary) or for the
    report of runs that exist, refusing the other's flags (``shaped``: --seeds, --set, --jobs,
    --init-from)."""
    is_config = len(paths) == 1 and Path(paths[0]).suffix in (".yaml", ".yml")
    if trains and not is_config:
        raise ConfigError("--vary sweeps one config: give a single CONFIG.yaml, no run folders")
    if is_config and not (trains or evaluates):
        raise ConfigError(
            f"{paths[0]}: a sweep needs --vary KEY=V1,V2,... (e.g. model.position=rope,alibi)"
        )
    if shaped and not is_config:
        raise ConfigError(
            "--seeds, --set, --jobs and --init-from shape a sweep: use them with CONFIG.yaml --vary"
        )
    return is_config


def _report_dir(paths: list[str], out: str | Path | None, runs: list[Path]) -> Path:
    """Where the report of runs that exist goes: ``out``; else the one folder given (the sweep,
    or the run, it is about); else the default one, unless it holds other runs' report."""
    if out is not None:
        return Path(out)
    if len(paths) == 1:
        return Path(paths[0])
    try:
        earlier = json.loads((DEFAULT_OUT / "report.json").read_text(encoding="utf-8"))
        theirs = {Path(r["run_dir"]).resolve() for r in earlier["runs"]}
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_OUT  # no report there, or none that lm wrote
    if theirs != {Path(r).resolve() for r in runs}:
        raise LMError(
            f"{DEFAULT_OUT}: holds the report of other runs; pass --out to write this one elsewhere"
        )
    return DEFAULT_OUT
