"""``lm export``: a run as a folder that Hugging Face ``transformers`` loads with no custom code.

OUT/config.json             the target architecture (lm.hf.weights says which, per scheme)
OUT/model.safetensors       the weights in its layout, in fp32, bf16 or fp16
OUT/generation_config.json  <eod> ends (and, as in lm, starts) a document; <pad> pads
OUT/tokenizer.json          the run's own tokenizer, unchanged
OUT/tokenizer_config.json   which tokens are pad/eos/unk, for AutoTokenizer
OUT/lm_config.yaml          the run's resolved config (``lm import`` reads it back)
OUT/README.md               a model card: data, steps, validation loss, scheme, how to load

The folder is written beside OUT and renamed into place, so it is whole or absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from lm.config.errors import LMError
from lm.config.load import read_yaml
from lm.config.outside import is_spec
from lm.config.sections import ModelConfig
from lm.data.tokenizer import EOD, PAD, UNK, TextTokenizer
from lm.hf import MODELS
from lm.hf.rope_parameters import ROPE_KEYS, rope_parameters
from lm.hf.shapes import ARCHITECTURES
from lm.hf.weights import HFModel, to_hf
from lm.runs.directory import CONFIG, PROVENANCE, check_out_dir, refuse_overlap
from lm.runs.load import LoadedRun, load_run

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LM_CONFIG = "lm_config.yaml"
DEFAULT_MAX_POSITIONS = 2048
MAX_POSITIONS = 2**24
"""The most --max-positions may say: float32, in which transformers computes positions, counts
whole numbers exactly only that far."""
TABLE_BYTES = 2**30
"""The largest position table an export writes (GPT-2's ``wpe`` of the sinusoidal and no-position
schemes, fp32): 1 GiB."""
NAMES = {model_type: name for model_type, (name, _) in MODELS.items()}
# What an export folder always holds; --overwrite replaces only such a folder (or an empty one).
_EXPORT_FILES = ("config.json", "model.safetensors")


@dataclass(frozen=True)
class Exported:
    out: Path
    model_type: str
    step: int
    max_positions: int


def require_transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise LMError(
            "this needs the Hugging Face extras: pip install -e '.[hf]' (transformers, lm-eval)"
        ) from None


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse an output folder that exists, unless ``overwrite``."""
    if not out.exists():
        return
    if not out.is_dir():
        raise LMError(f"{out}: exists and is not a folder")
    if not overwrite:
        raise LMError(f"{out}: already exists; pass --overwrite to replace it")


@contextlib.contextmanager
def built_folder(out: Path, what: str) -> Iterator[Path]:
    """A temporary folder beside ``out`` to write ``what`` into; it takes ``out``'s place only
    once the block has finished (the old folder goes last). On failure nothing of it stays, and
    an OS error (disk full, no permission) is one line naming ``out``."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise LMError(f"{out}: could not write the {what} ({e.strerror or e})") from None
    try:
        yield tmp
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        if out.exists():
            os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LMError(f"{out}: could not write the {what} ({e.strerror or e})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def max_positions_for(cfg: ModelConfig, requested: int | None) -> int:
    """The longest sequence the export accepts: a learned table's rows, else at least 2048."""
    if any(r.table for r in cfg.rows):
        rows = cfg.position_range  # context_length, or random_positions when trained so
        if requested is not None and requested != rows:
            raise LMError(
                f"--max-positions {requested}: a learned position table has exactly {rows} rows"
            )
        return rows
    if requested is None:
        yarn = cfg.rope_method == "yarn" and cfg.rope_factor != 1.0
        reach = cfg.rope_factor * cfg.rope_context
        if yarn and reach.is_integer() and reach >= cfg.context_length:
            return int(reach)  # YaRN's own range, S x L, which transformers checks it against
        return max(cfg.context_length, DEFAULT_MAX_POSITIONS)
    if requested < cfg.context_length:
        raise LMError(
            f"--max-positions {requested}: below the trained context_length {cfg.context_length}"
        )
    rows = TABLE_BYTES // (4 * cfg.d_model)
    if cfg.position in ("sinusoidal", "none") and requested > rows:
        raise LMError(
            f"--max-positions {requested}: the exported position table (GPT-2's wpe) would hold "
            f"{requested} x {cfg.d_model} floats, {requested * cfg.d_model * 4 / 2**30:.1f} GiB; "
            f"at most {rows} positions at d_model {cfg.d_model} (1 GiB)"
        )
    if requested > MAX_POSITIONS:
        raise LMError(
            f"--max-positions {requested}: at most {MAX_POSITIONS} (2^24; float32, in which "
            "transformers computes positions, counts whole numbers exactly only that far)"
        )
    return requested


def _refuse_outside(run_dir: Path) -> None:
    """A scheme written outside lm has no code in transformers: refused from config.yaml's
    text, before any of its code is imported."""
    try:
        position = read_yaml(run_dir / CONFIG)["model"]["position"]
    except (LMError, TypeError, KeyError):
        return  # loading the run says what is wrong
    named = [p for p in (position if isinstance(position, list) else [position]) if is_spec(p)]
    if named:
        raise LMError(
            f"{run_dir}: its position scheme {named[0]} is written outside lm, and transformers "
            "has no code for it: such a run cannot be exported"
        )


def export_run(
    run_dir: str | Path,
    out: str | Path,
    *,
    dtype: str = "fp32",
    checkpoint: str | Path | None = None,
    overwrite: bool = False,
    max_positions: int | None = None,
) -> Exported:
    """Write ``run_dir``'s model (newest checkpoint unless one is named) to ``out``."""
    run_dir, out = Path(run_dir), Path(out)
    if dtype not in DTYPES:
        raise LMError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    check_out_dir(out)
    named = Path(checkpoint) if checkpoint is not None and Path(checkpoint).exists() else None
    refuse_overlap(out, {"the run": run_dir, "the checkpoint": named})
    check_output(out, overwrite)
    if (
        overwrite
        and out.is_dir()
        and any(out.iterdir())
        and not all((out / name).is_file() for name in _EXPORT_FILES)
    ):
        raise LMError(f"{out}: not an lm export (no config.json, model.safetensors); not replaced")
    _refuse_outside(run_dir)
    run = load_run(run_dir, checkpoint)
    require_transformers()
    cfg = run.config.model
    positions = max_positions_for(cfg, max_positions)
    tok = run.tokenizer
    hf = to_hf(cfg, run.model.state_dict(), positions, {"pad": tok.pad_id, "eos": tok.eod_id})

    with built_folder(out, "export") as tmp:
        _write_model(tmp, hf, DTYPES[dtype])
        _write_tokenizer(tmp, tok, positions)
        shutil.copyfile(run_dir / CONFIG, tmp / LM_CONFIG)
        card = model_card(run_dir, out, run, hf, dtype, positions)
        (tmp / "README.md").write_text(card, encoding="utf-8")
    return Exported(out, hf.model_type, run.step, positions)


def _write_model(folder: Path, hf: HFModel, dtype: torch.dtype) -> None:
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.for_model(hf.model_type, **hf.config)
    config.dtype = dtype
    config.save_pretrained(folder)
    if hf.legacy:
        path = folder / "config.json"
        keys = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({**keys, **hf.legacy}, indent=2) + "\n", encoding="utf-8")
    tensors = {name: t.to(dtype).contiguous() for name, t in hf.tensors.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    generation = GenerationConfig(
        bos_token_id=hf.config["bos_token_id"],
        eos_token_id=hf.config["eos_token_id"],
        pad_token_id=hf.config["pad_token_id"],
    )
    generation.save_pretrained(folder)


def _write_tokenizer(folder: Path, tok: TextTokenizer, max_positions: int) -> None:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tok.to_json()),
        pad_token=PAD,
        eos_token=EOD,
        unk_token=UNK if tok.unk_id is not None else None,
        # lm never reads "<eod>" typed in a text as the special token, and adds nothing.
        split_special_tokens=True,
        clean_up_tokenization_spaces=False,
        padding_side="left",  # decoding a batch: every row's last token in the last column
        model_max_length=max_positions,
    )
    wrapped.save_pretrained(folder)
    # The generic class name, which transformers 4 and 5 both read.
    config_file = folder / "tokenizer_config.json"
    settings = json.loads(config_file.read_text(encoding="utf-8"))
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    # transformers adds an empty post-processor to its copy; keep the run's own file instead,
    # so that an import gives back the very same tokenizer.json.
    tok.save(folder / "tokenizer.json")


def _val_loss(run: LoadedRun) -> float | None:
    folder = run.checkpoint if run.checkpoint.is_dir() else run.checkpoint.parent
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = state.get("val_loss")
    return value if isinstance(value, (int, float)) else None


SCHEME_TEXT = {
    "rope": "RoPE on interleaved pairs, stored in transformers' rotate-half order (query and key "
    "rows of every head renumbered; the scores are the same)",
    "learned": "a learned absolute position table (GPT-2's `wpe`)",
    "sinusoidal": "the fixed sinusoids of Vaswani et al. in GPT-2's `wpe` ({positions} rows); the "
    "token embedding scaled by sqrt(d_model) is folded into `wte`, the head keeps the unscaled "
    "embedding",
    "none": "no position signal (GPT-2 with an all-zero `wpe`; only the causal mask orders tokens)",
    "alibi": "ALiBi linear distance biases (transformers' MPT, whose slopes equal lm's)",
}


def _block_text(m: ModelConfig) -> str:
    """The block as the model card names it."""
    if m.norm == "layernorm":
        return "pre-norm LayerNorm, exact GELU"
    kv = f"{m.kv_heads} key/value heads" if m.kv_heads != m.n_head else "a key/value head each"
    qk = ", QK-norm (RMSNorm of each head's query and key before RoPE)" if m.qk_norm else ""
    return f"pre-norm RMSNorm, SwiGLU, {kv}{qk}"


def _card_facts(run_dir: Path, run: LoadedRun, dtype: str, positions: int) -> list[tuple[str, str]]:
    """The model card's table: what the model is, what it saw, where it came from."""
    cfg, m = run.config, run.config.model
    origin = {}
    if (run_dir / PROVENANCE).is_file():
        try:
            origin = json.loads((run_dir / PROVENANCE).read_text(encoding="utf-8"))
        except ValueError:
            origin = {}
    scheme = SCHEME_TEXT[m.position].format(positions=positions)
    if m.position == "sinusoidal" and not m.scale_embeddings:
        unscaled = "; the token embedding in `wte` unscaled, as the notes add it"
        scheme = scheme.split("; the ")[0] + unscaled
    val = _val_loss(run)
    val_text = f"{val:.4f}" if val is not None else "not measured"
    commit = origin.get("git_commit") or "unknown"
    rope = []
    if m.position == "rope":
        settings = ", ".join(f"{key} {getattr(m, key)}" for key in ROPE_KEYS)
        written = json.dumps(rope_parameters(m))
        rope = [("RoPE", f"lm: {settings}; in config.json: `rope_parameters` {written}")]
    return [
        ("position scheme", f"`{m.position}`: {scheme}"),
        *rope,
        (
            "architecture",
            f"{m.n_layer} layers, {m.n_head} heads, d_model {m.d_model}, MLP {m.ff_dim}, "
            + _block_text(m),
        ),
        ("context", f"trained on {m.context_length} tokens; this export accepts {positions}"),
        (
            "data",
            f"`{cfg.data.source}`, validation: {cfg.data.val_split} {cfg.data.val_fraction}",
        ),
        (
            "tokenizer",
            f"`{cfg.data.tokenizer}`, {m.vocab_size} tokens; `<eod>` ends every document, "
            "`<pad>` pads",
        ),
        (
            "training",
            f"{run.step} optimizer steps, batch {cfg.train.batch_size} x {m.context_length}",
        ),
        ("validation loss", f"{val_text} (at step {run.step}, the checkpoint exported)"),
        ("weights", f"{dtype}, from `{run.checkpoint.name}`"),
        ("source", f"run `{run_dir}`, git commit `{commit}`, exported {time.strftime('%Y-%m-%d')}"),
    ]


def model_card(
    run_dir: Path, out: Path, run: LoadedRun, hf: HFModel, dtype: str, positions: int
) -> str:
    """The README.md of an export: what the model is, what it was trained on, how to load it."""
    cfg = run.config
    m = cfg.model
    arch = NAMES[hf.model_type]
    yaml_block = yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip()
    rows = _card_facts(run_dir, run, dtype, positions)
    table = "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [lm, {hf.model_type}, {m.position}]
---

# {run_dir.name}

A {run.model.num_parameters() / 1e6:.2f}M-parameter decoder-only language model trained with
`lm` and exported as **{arch}** (`{ARCHITECTURES[hf.model_type]}`),
so that `transformers` loads it with no custom code and computes the same logits as `lm`.

{table}

## Load it

```python
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

tok = AutoTokenizer.from_pretrained("{out}")
model = AutoModelForCausalLM.from_pretrained("{out}", dtype=torch.float32)
batch = tok(["def f", "The for statement"], return_tensors="pt", padding=True)  # left padding
out = model.generate(**batch, max_new_tokens=40, do_sample=False)
print(tok.batch_decode(out[:, batch["input_ids"].shape[1]:]))
```

Always pass the `attention_mask` with a padded batch. `lm` counts positions over real tokens
only; `generate` derives the same position ids from the mask, and a plain forward call needs
`position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0)` for GPT-2, GPT-NeoX, Llama and
Qwen3 exports (ALiBi depends only on distances, so MPT needs none). `lm sample` slides a window of
{m.context_length} tokens over longer texts; `generate` keeps the whole text.

Evaluate with lm-evaluation-harness:

```bash
lm_eval --model hf --model_args pretrained={out},dtype=float32 --tasks lambada_openai --device cpu
```

Back into `lm` (to sample, evaluate or fine-tune with `lm train --init-from`):
`lm import {out} --out runs/imported`.

## The `lm` config

```yaml
{yaml_block}
```
"""
