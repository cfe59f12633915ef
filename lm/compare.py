"""Compare runs that differ in one config key: by default the position scheme.

:func:`run_sweep` trains one run per value and seed into ``DIR/<key>=<value>/seed<N>``, every
other key as the config file says. The tokenizer and token ids come from data.py's cache, keyed
by content: the first run makes them and the others find them, so all runs see the same ids.
A sweep can be run again: finished runs are reused, an interrupted one resumes.

:func:`report` turns finished runs into ``report.md`` (a table with one row per compared value,
mean ± std over seeds), ``report.json`` (every number, per run), and three pictures: loss
against step and against wall time, and validation loss at 1x, 2x and 4x the trained context
(length extrapolation, measured by ``lm.evaluate.evaluate_run``, the code behind ``lm eval``).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm import plots
from lm.checkpoint import latest_checkpoint, read_state
from lm.config import Config, ConfigError, LMError, TrainConfig, load_config, parse_overrides
from lm.data import print_to_stderr
from lm.evaluate import evaluate_run
from lm.runs import CONFIG, METRICS, TOKENIZER, load_run
from lm.sample import generate
from lm.train import train

DEFAULT_OUT = Path("runs/compare")
DEFAULT_PROMPT = "The for statement"
EXTRAPOLATION = (1, 2, 4)
"""Evaluation contexts, as multiples of the trained one."""
# Keys that differ between runs without being what they compare.
NOT_COMPARED = ("model.vocab_size", "train.seed")


def _quiet(message: str) -> None:
    pass


# The sweep


def parse_vary(text: str) -> tuple[str, list[str]]:
    """``"model.position=rope,alibi"`` -> ``("model.position", ["rope", "alibi"])``.

    The key is checked as ``--set`` checks it; the values are checked when the configs are built.
    """
    if "=" not in text:
        raise ConfigError(
            f"--vary {text!r}: expected KEY=VALUE,VALUE,..., for example "
            "model.position=rope,sinusoidal"
        )
    key, values = text.split("=", 1)
    key = key.strip()
    texts = [v.strip() for v in values.split(",") if v.strip()]
    if not texts:
        raise ConfigError(f"--vary {key}: no values given after '='")
    if len(set(texts)) != len(texts):
        raise ConfigError(f"--vary {key}: a value is listed twice")
    if key == "train.seed":
        raise ConfigError("--vary train.seed: use --seeds to repeat runs over seeds")
    parse_overrides([f"{key}={v}" for v in texts])
    return key, texts


def _run_dir(out_dir: Path, key: str, value: str, seed: int) -> Path:
    safe = value.replace("/", "_")  # a path-like value must not become nested folders
    return out_dir / f"{key.split('.')[-1]}={safe}" / f"seed{seed}"


def _finished(state: dict[str, Any], tc: TrainConfig) -> bool:
    """Trained to ``max_steps``, or stopped early because it reached ``target_loss``."""
    if state["step"] >= tc.max_steps:
        return True
    val = state.get("val_loss")
    return tc.target_loss is not None and val is not None and val <= tc.target_loss


def _check_same_config(run_dir: Path, config: Config) -> None:
    """A run folder the sweep reuses or resumes must hold the run this sweep asks for; only
    ``train.max_steps`` may grow (the run then trains on)."""
    if not (run_dir / CONFIG).is_file():
        return
    saved = load_config(run_dir / CONFIG).to_dict()
    for section, values in config.to_dict().items():
        for key, value in values.items():
            name, old = f"{section}.{key}", saved[section][key]
            if name == "model.vocab_size" or (name == "train.max_steps" and value >= old):
                continue
            if old != value:
                raise LMError(
                    f"{run_dir}: was trained with {name}={old!r}, this sweep asks for {value!r}; "
                    "delete that folder or choose another --out"
                )


def run_sweep(
    config_path: str | Path,
    vary_key: str,
    values: list[str],
    seeds: list[int] | None = None,
    overrides: list[str] | None = None,
    out_dir: str | Path = DEFAULT_OUT,
    quiet: bool = False,
) -> list[Path]:
    """Train (or reuse, or resume) one run per value and seed; returns their folders in order.

    ``seeds`` default to the config's own ``train.seed``. Every config is built and checked
    before the first run starts, so a bad value fails at once, not after an hour of training.
    """
    overrides = overrides or []
    out_dir = Path(out_dir)
    log = _quiet if quiet else print_to_stderr
    if seeds is None:
        seeds = [load_config(config_path, overrides).train.seed]
    plan = [
        (
            _run_dir(out_dir, vary_key, value, seed),
            load_config(config_path, [*overrides, f"{vary_key}={value}", f"train.seed={seed}"]),
        )
        for value in values
        for seed in seeds
    ]
    for run_dir, config in plan:
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is not None:
            _check_same_config(run_dir, config)
            state = read_state(checkpoint)
            if _finished(state, config.train):
                log(f"compare: {run_dir} is finished (step {state['step']}); reusing it")
                continue
            log(f"compare: resuming {run_dir} from step {state['step']}")
        else:
            log(f"compare: training {run_dir}")
        # Without a checkpoint, whatever the folder holds (a run killed before its first
        # save) is cleared and training starts over.
        result = train(
            config,
            run_dir,
            resume=checkpoint is not None,
            overwrite=checkpoint is None,
            quiet=quiet,
        )
        if result.status == "interrupted":
            raise KeyboardInterrupt
        if result.status not in ("done", "target"):
            raise LMError(f"{run_dir}: {result.message}")
    return [run_dir for run_dir, _ in plan]


# The report


@dataclass
class RunSummary:
    """What the report shows of one run."""

    run_dir: Path
    label: str
    seed: int
    parameters: int
    step: int
    tokens_seen: int
    tokens_exact: bool
    """False when counted from the logged throughput (padded batches hold a varying count)."""
    final_val_loss: float | None
    best_val_loss: float | None
    tokens_per_s: float | None
    wall_s: float | None
    extrapolation: list[dict[str, Any]]
    """evaluate_run's rows at 1x, 2x, 4x the trained context."""
    continuation: str
    tokenizer_sha256: str
    data_cache: str | None
    trained_context: int
    eval_batches: int | None
    """Batches per context length of the extrapolation evaluation (None: the whole split)."""
    metrics: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "metrics"}
        out["run_dir"] = str(self.run_dir)
        return out


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


def _read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / METRICS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _tokens_seen(config: Config, step: int, records: list[dict[str, Any]]) -> tuple[int, bool]:
    """Training tokens (targets) consumed: exact for packed windows (every slot is a real token),
    else summed from each logged interval's throughput times its duration."""
    if config.data.mode == "packed":
        return step * config.train.batch_size * config.model.context_length, True
    total, before = 0.0, 0.0
    for r in records:
        if "tokens_per_s" in r:
            total += r["tokens_per_s"] * (r["elapsed_s"] - before)
            before = r["elapsed_s"]
    return round(total), False


def _flat(config: Config) -> dict[str, Any]:
    return {f"{s}.{k}": v for s, values in config.to_dict().items() for k, v in values.items()}


def _labels(configs: list[Config]) -> tuple[str, list[str]]:
    """The compared keys' short name and each run's value(s) of them, found by diffing configs."""
    flat = [_flat(c) for c in configs]
    varied = [k for k in flat[0] if k not in NOT_COMPARED and len({repr(f[k]) for f in flat}) > 1]
    if not varied:  # nothing differs but the seed: one group
        return "run", ["same config"] * len(configs)
    if len(varied) == 1:
        return varied[0].split(".")[-1], [str(f[varied[0]]) for f in flat]
    names = [k.split(".")[-1] for k in varied]
    labels = [", ".join(f"{n}={f[k]}" for n, k in zip(names, varied, strict=True)) for f in flat]
    return "runs", labels


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _summarise(
    run_dir: Path,
    label: str,
    prompt: str,
    max_new_tokens: int,
    eval_batches: int | None,
    device: str,
) -> RunSummary:
    run = load_run(run_dir, device=device)
    cfg = run.config
    records = _read_metrics(run_dir)
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    elapsed = [r["elapsed_s"] for r in records if "elapsed_s" in r]
    C = cfg.model.context_length
    if eval_batches is None:
        eval_batches = cfg.train.eval_steps
    rows = evaluate_run(
        run_dir, [m * C for m in EXTRAPOLATION], device=device, max_batches=eval_batches
    )
    tok = run.tokenizer
    prompt_ids = tok.encode(prompt) or [tok.eod_id]
    new = generate(run.model, [prompt_ids], max_new_tokens, tok.pad_id, tok.eod_id)[0]
    tokens, exact = _tokens_seen(cfg, run.step, records)
    state = read_state(run.checkpoint)
    return RunSummary(
        run_dir=run_dir,
        label=label,
        seed=cfg.train.seed,
        parameters=run.model.num_parameters(),
        step=run.step,
        tokens_seen=tokens,
        tokens_exact=exact,
        final_val_loss=vals[-1] if vals else None,
        best_val_loss=min(vals) if vals else None,
        tokens_per_s=statistics.median(speeds) if speeds else None,
        wall_s=elapsed[-1] if elapsed else None,
        extrapolation=rows,
        continuation=tok.decode(new),
        tokenizer_sha256=_sha256(run_dir / TOKENIZER),
        data_cache=state.get("data", {}).get("cache"),
        trained_context=C,
        eval_batches=eval_batches,
        metrics=records,
    )


def _mean_std(values: list[float | None], fmt: str) -> str:
    """``mean ± std`` over seeds (sample std); one value or all equal: the value alone; any
    missing: n/a."""
    if not values or any(v is None for v in values):
        return "n/a"
    if len(set(values)) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.mean(values), fmt)} ± {format(statistics.stdev(values), fmt)}"


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f}s"
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes}m {s:02d}s" if minutes else f"{s}s"


def _cell(text: str) -> str:
    """Text as one Markdown table cell: newlines visible, pipes escaped."""
    return text.replace("|", "\\|").replace("\n", "↵").replace("\r", "")


def _table(header: str, groups: dict[str, list[RunSummary]]) -> tuple[list[str], list[str]]:
    """The Markdown table, one row per group, and its footnotes (why a cell says n/a)."""
    trained = {runs[0].trained_context for runs in groups.values()}
    if len(trained) == 1:  # name the lengths; runs of different contexts share only multiples
        C = trained.pop()
        at = [f"val loss @{m * C} ({m}×)" for m in EXTRAPOLATION]
    else:
        at = [f"val loss @{m}× context" for m in EXTRAPOLATION]
    columns = [header, "seeds", "parameters", "steps", "tokens seen", "final val loss"]
    columns += ["best val loss", "tokens/s", "wall time", *at]
    lines = ["| " + " | ".join(columns) + " |", "|---" + "|---:" * (len(columns) - 1) + "|"]
    notes: list[str] = []
    for label, runs in groups.items():
        tokens = statistics.mean(r.tokens_seen for r in runs)
        walls = [r.wall_s for r in runs]
        cells = [
            _cell(label),
            str(len(runs)),
            f"{runs[0].parameters:,}",
            _mean_std([r.step for r in runs], ".0f"),
            ("" if runs[0].tokens_exact else "≈") + f"{tokens:,.0f}",
            _mean_std([r.final_val_loss for r in runs], ".4f"),
            _mean_std([r.best_val_loss for r in runs], ".4f"),
            _mean_std([r.tokens_per_s for r in runs], ",.0f"),
            "n/a" if None in walls else _duration(statistics.mean(walls)),
        ]
        for i in range(len(EXTRAPOLATION)):
            rows = [r.extrapolation[i] for r in runs]
            cell = _mean_std([row["loss"] for row in rows], ".4f")
            note = next((row["note"] for row in rows if row.get("note")), None)
            if note is not None:
                if note not in notes:
                    notes.append(note)
                cell += f" [{notes.index(note) + 1}]"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return lines, [f"[{i}] {note}" for i, note in enumerate(notes, 1)]


def _sharing(summaries: list[RunSummary]) -> str:
    """Whether the runs really shared one tokenizer and one set of token ids (checked, not
    assumed: the hash of every run's tokenizer.json and the cache its checkpoint names)."""
    tokenizers = {s.tokenizer_sha256 for s in summaries}
    caches = {s.data_cache for s in summaries}
    if len(tokenizers) == 1 and len(caches) == 1:
        return (
            f"All {len(summaries)} runs share one tokenizer (tokenizer.json sha256 "
            f"`{next(iter(tokenizers))[:16]}`) and one set of cached token ids "
            f"(`{Path(next(iter(caches)) or '?').name}`)."
        )
    return (
        f"The runs do not all share their data: {len(tokenizers)} distinct tokenizers and "
        f"{len(caches)} token-id caches (see report.json)."
    )


def _curves(groups: dict[str, list[RunSummary]], x: str, y: str) -> plots.Curves:
    return {
        label: [
            ([r[x] for r in s.metrics if y in r], [r[y] for r in s.metrics if y in r]) for s in runs
        ]
        for label, runs in groups.items()
    }


def _draw(groups: dict[str, list[RunSummary]], out_dir: Path) -> list[Path]:
    panels = {
        x_name: {
            "training loss": _curves(groups, x, "train_loss"),
            "validation loss": _curves(groups, x, "val_loss"),
        }
        for x, x_name in (("step", "step"), ("elapsed_s", "wall time (s)"))
    }
    extrapolation = {
        label: [
            (
                [row["context_length"] for row in s.extrapolation],
                [math.nan if row["loss"] is None else row["loss"] for row in s.extrapolation],
            )
            for s in runs
        ]
        for label, runs in groups.items()
    }
    return [
        plots.loss_curves(panels["step"], "step", out_dir / "loss_vs_step.png"),
        plots.loss_curves(panels["wall time (s)"], "wall time (s)", out_dir / "loss_vs_time.png"),
        plots.loss_vs_context(
            extrapolation,
            {label: runs[0].trained_context for label, runs in groups.items()},
            out_dir / "loss_vs_context.png",
        ),
    ]


def report(
    run_dirs: list[Path],
    out_dir: str | Path = DEFAULT_OUT,
    *,
    prompt: str | None = None,
    max_new_tokens: int = 80,
    eval_batches: int | None = None,
    device: str = "cpu",
    log: Callable[[str], None] = print_to_stderr,
) -> str:
    """Write ``report.md``, ``report.json`` and the PNGs into ``out_dir``; return the Markdown.

    ``eval_batches`` bounds the extrapolation evaluation (default: each run's
    ``train.eval_steps``, the budget of its own validation loss; the whole split when unset).
    """
    if not run_dirs:
        raise LMError("compare: no runs to report on")
    prompt = DEFAULT_PROMPT if prompt is None else prompt
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = [load_config(Path(r) / CONFIG) for r in run_dirs]
    header, labels = _labels(configs)
    summaries = []
    for run_dir, label in zip(run_dirs, labels, strict=True):
        log(f"compare: evaluating {run_dir}")
        summaries.append(
            _summarise(Path(run_dir), label, prompt, max_new_tokens, eval_batches, device)
        )
    groups: dict[str, list[RunSummary]] = {}
    for s in summaries:
        groups.setdefault(s.label, []).append(s)

    table, notes = _table(header, groups)
    pictures = _draw(groups, out_dir)
    budgets = {s.eval_batches for s in summaries}
    budget = "the whole of"
    if budgets != {None}:
        budget = f"the first {'/'.join(sorted(str(b) for b in budgets))} batches of"
    seeds = sorted({len(runs) for runs in groups.values()})
    lines = [
        f"# Runs compared by {header}",
        "",
        f"{len(summaries)} runs: {len(groups)} values of {header}, "
        f"{'-'.join(map(str, seeds))} seed(s) each. {_sharing(summaries)}",
        "Losses are mean next-token cross-entropy in nats per token on the validation split, "
        f"mean ± std over seeds. `val loss @N` is measured at context length N on {budget} the "
        "validation split by `lm.evaluate.evaluate_run` (the code behind `lm eval`).",
        "",
        *table,
        "",
        *(line for note in notes for line in (note, "")),
        *(f"![{p.stem.replace('_', ' ')}]({p.name})" for p in pictures),
        "",
        f"## Greedy continuations of “{prompt}”",
        "",
        f"| {header} | seed | continuation ({max_new_tokens} tokens at most; ↵ is a newline) |",
        "|---|---:|---|",
        *(f"| {_cell(s.label)} | {s.seed} | {_cell(prompt + s.continuation)} |" for s in summaries),
        "",
    ]
    markdown = "\n".join(lines)
    (out_dir / "report.md").write_text(markdown, encoding="utf-8")
    numbers = {
        "compared": header,
        "prompt": prompt,
        "runs": [s.to_json() for s in summaries],
    }
    (out_dir / "report.json").write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
    log(f"compare: wrote {out_dir / 'report.md'}, report.json and {len(pictures)} pictures")
    return markdown


def compare(
    paths: list[str],
    vary: str | None = None,
    seeds: list[int] | None = None,
    overrides: list[str] | None = None,
    out: str | Path | None = None,
    quiet: bool = False,
    **report_options: Any,
) -> str:
    """``lm compare``: a sweep (one config file and ``vary``), then its report; or the report
    of runs that exist (run folders, or folders holding them). Returns the Markdown."""
    is_config = len(paths) == 1 and Path(paths[0]).suffix in (".yaml", ".yml")
    log = _quiet if quiet else print_to_stderr
    if vary is not None or is_config:
        if not is_config:
            raise ConfigError("--vary sweeps one config: give a single CONFIG.yaml, no run folders")
        if vary is None:
            raise ConfigError(
                f"{paths[0]}: a sweep needs --vary KEY=V1,V2,... (e.g. model.position=rope,alibi)"
            )
        key, values = parse_vary(vary)
        out_dir = Path(out) if out is not None else DEFAULT_OUT
        runs = run_sweep(paths[0], key, values, seeds, overrides, out_dir, quiet)
        return report(runs, out_dir, log=log, **report_options)
    if seeds is not None or overrides:
        raise ConfigError("--seeds and --set shape a sweep: use them with CONFIG.yaml --vary")
    runs = find_runs(paths)
    if out is not None:
        out_dir = Path(out)
    elif len(paths) == 1 and not (Path(paths[0]) / CONFIG).is_file():
        out_dir = Path(paths[0])  # the sweep folder the runs came from
    else:
        out_dir = DEFAULT_OUT
    return report(runs, out_dir, log=log, **report_options)
