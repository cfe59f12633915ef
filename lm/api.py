"""The Python API: what a notebook or a script calls, a few lines each. ``import lm`` offers
these names; the command line is a client of the same functions (docs/python-api.md).

Runs: :func:`train` a config into a run directory, :func:`load` a trained run, :func:`generate`
text from prompts, :func:`loss_at` context lengths. The notes' formulas, as the model computes
them: :func:`attention` (``Y, A`` of ``softmax(QK^T/sqrt(d_k) + M) V``), :func:`causal_mask`,
:func:`attention_mask` (the key and causal masks of a padded batch), :func:`sinusoids` and
:func:`rope` (RoPE's rotation of queries or keys). :func:`view`: the ``lm view`` page of a run
and a prompt, shown inline in Jupyter; :func:`heads`: each head's previous-token, induction,
duplicate and first-token scores and the in-context learning score (``lm heads``);
:func:`bench`: a position scheme's card against the builtins (``lm bench``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from lm.benchmark.run import bench as bench_scheme
from lm.config.errors import ARGUMENTS, LMError
from lm.config.load import load_config, with_overrides
from lm.config.outside import trusting
from lm.config.sections import Config
from lm.config.values import checked_text, finite_at_least_zero, whole_number
from lm.evaluate import evaluate_lengths, length_specs, load_with_rope_scaling
from lm.evaluate_heads import heads_of_run
from lm.explorer.gather import prompt_ids, run_page
from lm.explorer.make import kind_of, page_html, run_name
from lm.explorer.page import Page, render
from lm.model import kernels, masks
from lm.model.masks import allowed_keys
from lm.model.schemes.embeddings import sinusoidal_table
from lm.model.schemes.rope import RopeAngles, rotate_pairs
from lm.runs.directory import check_out_dir, refuse_overlap
from lm.runs.load import LoadedRun
from lm.runtime.device import resolve_device
from lm.sample import generate as generate_ids
from lm.training.loop import TrainResult
from lm.training.loop import train as train_run
from lm.training.setup import config_for_init, recorded_init_from

__all__ = [
    "attention",
    "attention_mask",
    "bench",
    "causal_mask",
    "generate",
    "heads",
    "load",
    "loss_at",
    "rope",
    "sinusoids",
    "train",
    "view",
]


def _path(value: object, name: str) -> Path:
    """An argument naming a file or folder, as a Path; anything else one line naming it."""
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    raise LMError(f"{name}: {value!r} is not a path: give a str or a pathlib.Path")


def _overrides(value: object, name: str) -> list[str]:
    """``overrides``: one ``KEY=VALUE`` text, or a list or tuple of them."""
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (list, tuple)) and all(isinstance(item, str) for item in items):
        return list(items)
    raise LMError(f"{name}: {value!r} is not KEY=VALUE text or a list of it (train.lr=3e-4)")


def train(
    config: Config | str | Path,
    out: str | Path | None = None,
    *,
    overrides: str | Sequence[str] = (),
    resume: bool = False,
    overwrite: bool = False,
    init_from: str | Path | None = None,
    quiet: bool = False,
    notes: Callable[[str], None] | None = None,
    names: dict[str, str] = ARGUMENTS,
) -> TrainResult:
    """Train a config (a YAML path or a :class:`lm.config.Config`, with dotted ``overrides``
    such as ``"train.max_steps=50"``: one text or a list) into ``out`` (default
    ``runs/<config name>``, or ``runs/default`` for a Config); ``lm train``. ``init_from``:
    start from another run's weights (its tokenizer, fresh optimizer, step 0). Returns how it
    ended: ``.status`` (done, target, interrupted, ...), ``.step``, ``.val_loss``,
    ``.run_dir``. ``names``: how an error names the arguments (the command line's flags:
    ``lm.config.errors.FLAGS``)."""
    if resume and overwrite:
        raise LMError(
            "resume and overwrite: give one (resume continues the run, overwrite discards it)"
        )
    overrides = _overrides(overrides, names["overrides"])
    if isinstance(config, Config):
        name = "default"
        config = with_overrides(config, overrides, names["overrides"]) if overrides else config
    elif isinstance(config, (str, os.PathLike)):
        name = Path(config).stem
        config = load_config(config, overrides, names["overrides"])
    else:
        raise LMError(f"config: {config!r} is not a config: give a YAML file's path or a Config")
    out = _path(out, names["out"]) if out is not None else Path("runs") / name
    run_dir = check_out_dir(out, names["out"])
    init_from = None if init_from is None else _path(init_from, names["init_from"])
    refuse_overlap(run_dir, {names["init_from"]: init_from}, names["out"])
    # A run started from another's weights resumes with that run's tokenizer, as it began.
    source = init_from or (recorded_init_from(run_dir) if resume else None)
    if source:
        config = config_for_init(config, source, notes, names["init_from"])
    return train_run(
        config, run_dir, resume=resume, overwrite=overwrite, quiet=quiet, init_from=init_from
    )


def bench(
    position: str,
    *,
    overrides: str | Sequence[str] = (),
    quick: bool = False,
    out: str | Path | None = None,
    jobs: int | str = 1,
    quiet: bool = False,
) -> dict[str, Any]:
    """``lm bench``: the scheme ``position`` (a builtin's name, or ``path/to/file.py:Class``)
    through the battery, ``overrides`` on every benchmark, 3 seeds (``quick``: 1 seed, smaller
    budgets); card.md, card.json and card.html written into ``out`` (default
    ``runs/bench/<name>``). Returns the card: card.json's content (docs/bench.md)."""
    if not isinstance(position, str):
        raise LMError(f"position: {position!r} is not a scheme's name or spec")
    if jobs != "auto" and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise LMError(f"jobs: {jobs!r} is not a whole number of at least 1 or 'auto'")
    out = None if out is None else _path(out, "out")
    overrides = _overrides(overrides, "overrides")
    card, _ = bench_scheme(position, overrides, quick is True, out, jobs, quiet=quiet is True)
    return card


def load(
    run_dir: str | Path,
    *,
    checkpoint: str | Path | None = None,
    device: str = "auto",
    rope_scaling: str | None = None,
    trust_code: bool = False,
    names: dict[str, str] = ARGUMENTS,
) -> LoadedRun:
    """A trained run: ``.model`` (a :class:`lm.model.TransformerLM` in eval mode), ``.tokenizer``,
    ``.config``, ``.step``. The newest checkpoint unless ``checkpoint`` names one (a folder, or
    ``step_00000030``); ``rope_scaling`` (``pi:4``, ``ntk:4``, ``yarn:4``, ``none``) evaluates
    a RoPE run with another context extension, the same weights. ``trust_code``: import the
    run's copy of a position scheme written outside lm (its code runs: only for a run you
    trust; docs/positions.md, "Your own scheme"). ``names``: as :func:`train`'s."""
    run_dir = _path(run_dir, "run_dir")
    if checkpoint is not None:
        checkpoint = _path(checkpoint, names["checkpoint"])
    if rope_scaling is not None:
        rope_scaling = checked_text(rope_scaling, names["rope_scaling"])
    if not isinstance(device, str):
        raise LMError(f"device: {device!r} is not a device name (auto, cpu, cuda, cuda:N, mps)")
    where = str(resolve_device(device, "device"))
    with trusting(trust_code is True):
        return load_with_rope_scaling(run_dir, checkpoint, where, rope_scaling, names)


def _loaded(run: LoadedRun | str | Path) -> LoadedRun:
    """A run as :func:`load` gives it; a run directory is loaded (its newest checkpoint, on the
    default device)."""
    if isinstance(run, LoadedRun):
        return run
    if isinstance(run, (str, Path)):
        return load(run)
    raise LMError(f"run: {type(run).__name__} is not a run: give lm.load(RUN_DIR) or RUN_DIR")


def generate(
    run: LoadedRun | str | Path,
    prompts: str | Sequence[str],
    max_new_tokens: int = 200,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
    kv_cache: bool = True,
    compile: bool = False,
) -> list[str]:
    """Each prompt continued by ``max_new_tokens`` tokens (fewer where the model ends the
    document): the prompt and its continuation, one text per prompt. Greedy by default; with
    ``temperature > 0`` sampled (``top_k`` likeliest tokens, ``seed`` for the same draw again).
    The prompts decode as one left-padded batch, each exactly as it would alone; an empty prompt
    starts a new document. ``run`` may be a run directory, loaded as :func:`load` does.
    Arguments ``lm sample`` would refuse raise LMError with its message."""
    texts = [prompts] if isinstance(prompts, str) else prompts
    if not isinstance(texts, (list, tuple)):
        raise LMError(f"prompts: {prompts!r} is not text or a list of texts")
    if not texts:
        raise LMError("prompts: none given (an empty string '' starts a new document)")
    texts = [checked_text(text, "prompts") for text in texts]
    whole_number(max_new_tokens, 1, "max_new_tokens")
    temperature = finite_at_least_zero(temperature, "temperature")
    if top_k is not None:
        whole_number(top_k, 1, "top_k")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise LMError(f"seed: {seed!r} is not an integer")
    run = _loaded(run)
    tok = run.tokenizer
    encoded = [tok.encode(text) or [tok.eod_id] for text in texts]
    new = generate_ids(
        run.model,
        encoded,
        max_new_tokens,
        tok.pad_id,
        tok.eod_id,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
        use_cache=kv_cache,
        compile_step=compile,
    )
    return [text + tok.decode(ids) for text, ids in zip(texts, new, strict=True)]


def loss_at(
    run: LoadedRun | str | Path,
    lengths: str | int | Sequence[str | int] = ("1x",),
    *,
    split: str = "val",
    batch_size: int | None = None,
    max_batches: int | None = None,
) -> dict[int, float | None]:
    """Mean next-token loss at each context length, in tokens or multiples of the trained one
    (``"2x"``): ``{length: loss}``, None where the model has no positions that long (a learned
    table). The run's own split (``val`` or ``train``), read in non-overlapping windows;
    ``lm eval``, whose refusals raise LMError with its message. What ``lm eval`` notes under
    its table, a warning says: a length no window reaches (the loss is over shorter windows,
    the whole split), or why a length has no loss."""
    specs = length_specs(lengths)
    for value, name in ((batch_size, "batch_size"), (max_batches, "max_batches")):
        if value is not None:
            whole_number(value, 1, name)
    run = _loaded(run)
    device = str(next(run.model.parameters()).device)
    rows = evaluate_lengths(run, run.run_dir, specs, split, batch_size, device, max_batches)
    for row in rows:
        if row.get("note"):
            warnings.warn(f"lengths: {row['context_length']}: {row['note']}", stacklevel=2)
    return {row["context_length"]: row["loss"] for row in rows}


def heads(run: str | Path, step: int | None = None, *, device: str = "auto") -> dict[str, Any]:
    """``lm heads --json``: the scores of a run's newest checkpoint, or of the one at ``step``
    (docs/heads.md): ``scores`` ({``previous_token``, ``induction``, ``duplicate_token``,
    ``first_token``}: [layer][head]), ``icl_score``, ``step``, ``checkpoint``, ``probe``,
    ``icl``. A step with no checkpoint raises LMError listing the steps there are."""
    run = _path(run, "run")
    if not isinstance(device, str):
        raise LMError(f"device: {device!r} is not a device name (auto, cpu, cuda, cuda:N, mps)")
    return heads_of_run(run, step, str(resolve_device(device, "device")), "step")


def _tensor(value: object, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    raise LMError(f"{name}: {type(value).__name__} is not a tensor (torch.tensor({value!r}))")


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The notes' ``Y, A`` of ``softmax_row(QK^T/sqrt(d_k) + M) V``: ``(Y, A)`` for q ``[...,
    L_q, d_k]``, k ``[..., L_k, d_k]``, v ``[..., L_k, d_v]``; ``mask`` additive or boolean."""
    for value, name in ((q, "q"), (k, "k"), (v, "v"), (mask, "mask")):
        if value is not None or name != "mask":
            _tensor(value, name)
    return kernels.attention(q, k, v, mask)


def causal_mask(L: int) -> torch.Tensor:
    """The notes' additive causal mask ``M`` ``[L, L]``: 0 on and below the diagonal, -inf
    above."""
    return masks.causal_mask(whole_number(L, 1, "L"))


def attention_mask(key_mask: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Which keys each query of a padded batch may read, ``[B, 1, L, L]`` (True = may read), from
    ``key_mask [B, L]`` (True = real token): the notes' key mask (a pad supplies no value),
    and with ``causal`` the causal mask (no key after its query). A query with no key to read
    (left padding) reads every key instead, as the model's kernels do, and is zeroed after.
    Without ``causal`` every query reads the same keys: the one row, repeated (a view)."""
    B, L = _tensor(key_mask, "key_mask").shape
    mask, _ = allowed_keys(key_mask, None, causal, L, L, 0, key_mask.device)
    return mask.expand(B, 1, L, L)


def sinusoids(length: int, d: int) -> torch.Tensor:
    """The notes' fixed sinusoids ``[length, d]``: ``p[l, 2i] = sin(l w_i)``, ``p[l, 2i+1] =
    cos(l w_i)``, ``w_i = 10000^(-2i/d)``."""
    return sinusoidal_table(whole_number(length, 1, "length"), whole_number(d, 2, "d"))


def rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE as the notes write it: pair ``i`` of ``x [..., L, d_k]`` (features ``2i, 2i+1``) at
    position ``l`` (``positions [L]``) rotated by ``l theta_i``, ``theta_i = base^(-2i/d_k)``.
    ``x`` is a floating-point tensor (a rotation of integers would round to them)."""
    x, positions = _tensor(x, "x"), _tensor(positions, "positions")
    if not x.is_floating_point():
        raise LMError(f"rope: x is a {x.dtype} tensor; rotate a floating-point one (x.float())")
    cos, sin = RopeAngles(x.shape[-1], base).cos_sin(positions, x.dtype)
    return rotate_pairs(x, cos, sin)


def view(
    run: LoadedRun | str | Path,
    prompt: str | None = None,
    *,
    device: str = "auto",
    trust_code: bool = False,
) -> Page:
    """The ``lm view`` page of a run (a :func:`load`-ed one, or its folder) on ``prompt``, or of
    a comparison's folder (``prompt`` default: its report's): attention maps of every layer and
    head, the position signal against distance, the 1x and 4x views. In Jupyter it shows
    inline; ``.save(path)`` writes it, ``.html`` is its text. ``trust_code``: as :func:`load`'s."""
    if prompt is not None:
        checked_text(prompt, "prompt")
    if not isinstance(run, LoadedRun):
        path = _path(run, "run")
        if kind_of(path) == "compare":
            with trusting(trust_code is True):
                return Page(page_html(path, prompt, str(resolve_device(device, "device"))))
        run = load(path, device=device, trust_code=trust_code)
    if prompt is None:
        raise LMError("prompt: a run's page needs the text whose attention to show")
    prompt_ids(run, prompt, "prompt")  # checked, and named as the API names it
    name = run_name(run.run_dir) if run.run_dir is not None else "run"
    return Page(render(run_page(run, prompt, name)))
