"""``lm import``: a Hugging Face model folder (GPT-2, GPT-NeoX, MPT, Llama or Qwen3 shaped) as an
``lm`` run.

The run holds config.yaml, tokenizer.json, run.json (saying where the weights came from) and one
checkpoint, ``checkpoints/step_00000000``, with weights only: ``lm sample``, ``lm eval`` and
``lm train --init-from`` accept it. Whatever ``lm``'s model cannot compute exactly is refused in
one line naming the first mismatch (lm.hf.shapes). An ``lm export`` folder comes back bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from lm.config.errors import ConfigError, LMError
from lm.config.load import config_from_dict, read_yaml, save_config
from lm.config.names import extends
from lm.config.sections import Config, DataConfig, ModelConfig
from lm.data.tokenizer import TextTokenizer
from lm.hf.export import LM_CONFIG, built_folder, check_output, require_transformers
from lm.hf.rope_parameters import ROPE_KEYS, rope_parameters
from lm.hf.shapes import model_shape
from lm.hf.weights import from_hf
from lm.model.transformer import TransformerLM
from lm.runs.checkpoint import latest_checkpoint, save_checkpoint
from lm.runs.directory import (
    CONFIG,
    METRICS,
    PROVENANCE,
    TOKENIZER,
    check_out_dir,
    provenance,
    refuse_overlap,
)


def import_model(hf_dir: str | Path, out: str | Path, *, overwrite: bool = False) -> Imported:
    """Write the model in ``hf_dir`` as a run in ``out``; returns what was imported."""
    hf_dir, out = Path(hf_dir), Path(out)
    where = str(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise LMError(f"{hf_dir}: not a Hugging Face model folder (no config.json)")
    check_out_dir(out)
    refuse_overlap(out, {"the model folder": hf_dir})
    check_output(out, overwrite)
    if overwrite and out.is_dir() and any(out.iterdir()) and not _is_run(out):
        raise LMError(f"{out}: not an lm run (no config.yaml); not replaced")
    require_transformers()
    config = _read_config(hf_dir)
    shape = model_shape(where, config)
    tokenizer = TextTokenizer.load(hf_dir / TOKENIZER)
    keys, state = from_hf(where, config, _read_weights(hf_dir), shape)

    rows = state["embed.weight"].shape[0]
    if rows != tokenizer.vocab_size:
        raise LMError(
            f"{where}: the embedding has {rows} rows but tokenizer.json has "
            f"{tokenizer.vocab_size} tokens; lm needs one row per token"
        )
    cfg = _run_config(hf_dir, {**keys, "vocab_size": rows}, out)
    model = TransformerLM(cfg.model)
    model.load_state_dict(state, strict=True)

    source = {"imported_from": str(hf_dir.resolve()), "model_type": config.model_type}
    with built_folder(out, "run") as tmp:
        save_config(cfg, tmp / CONFIG)
        tokenizer.save(tmp / TOKENIZER)
        record = {**source, **provenance()}
        (tmp / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        save_checkpoint(tmp, 0, model, None, {"val_loss": None, **source}, keep=1)
    return Imported(out, config.model_type, cfg.model, model.num_parameters())


@dataclasses.dataclass(frozen=True)
class Imported:
    """What ``lm import`` made: the run folder and the model it holds."""

    out: Path
    model_type: str
    model: ModelConfig
    parameters: int

    def summary(self) -> str:
        """One line: the architecture, the size, the position scheme and its settings."""
        m = self.model
        kv = f" ({m.kv_heads} key/value)" if m.kv_heads != m.n_head else ""
        shape = (
            f"{m.n_layer} layers, {m.n_head} heads{kv}, width {m.d_model}, "
            f"context {m.context_length}"
        )
        scheme = m.position_text
        if extends(m.layer_positions):
            settings = [f"rope_base {m.rope_base:g}", f"rope_scaling {m.rope_scaling or 'none'}"]
            if m.rope_fraction != 1.0:
                settings.append(f"rope_fraction {m.rope_fraction:g}")
            scheme += " (" + ", ".join(settings) + ")"
        return (
            f"imported {self.model_type} as a run: {self.parameters / 1e6:.2f}M parameters, "
            f"{shape}, {scheme} positions"
        )


def _is_run(folder: Path) -> bool:
    return (
        (folder / CONFIG).is_file()
        or (folder / METRICS).is_file()
        or bool(latest_checkpoint(folder))
    )


def _read_config(hf_dir: Path) -> Any:
    """The folder's config as transformers reads it (legacy key names normalised)."""
    from transformers import AutoConfig

    try:
        raw = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise LMError(f"{hf_dir}/config.json: not valid JSON ({e})") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise LMError(f"{hf_dir}/config.json: has no model_type")
    try:
        return AutoConfig.from_pretrained(str(hf_dir), trust_remote_code=False)
    except (ValueError, KeyError, TypeError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LMError(
            f"{hf_dir}/config.json: model_type {raw['model_type']!r} cannot be read ({first})"
        ) from None


def _read_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors`` (or its shards); pickled weights are refused."""
    single, index = hf_dir / "model.safetensors", hf_dir / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError):
            raise LMError(f"{index}: not a valid safetensors index") from None
        files = [hf_dir / name for name in sorted(set(weight_map.values()))]
    elif any((hf_dir / n).exists() for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        raise LMError(
            f"{hf_dir}: weights only as pytorch_model.bin (pickle, which lm never loads); "
            "save them as safetensors first"
        )
    else:
        raise LMError(f"{hf_dir}: no model.safetensors")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(str(file)))
        except (SafetensorError, OSError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise LMError(f"{file}: cannot read the weights ({first})") from None
    return tensors


def _run_config(hf_dir: Path, keys: dict[str, Any], out: Path) -> Config:
    """The run's config: the model from the weights; data and train sections, and what the
    weights do not say (the trained context of a scheme with no table, dropout, the attention
    kernel, how the run spelled its RoPE settings: ``ntk:4`` over base 10000 rather than the
    base it exports as), from the ``lm_config.yaml`` an export leaves, when it matches the
    weights; otherwise defaults, with the run's own tokenizer."""
    path = hf_dir / LM_CONFIG
    if path.is_file():
        try:
            saved = config_from_dict(read_yaml(path))
        except ConfigError as e:
            raise LMError(f"{path}: {e}") from None
        if (
            saved.model.position == keys["position"]
            and saved.model.context_length <= keys["context_length"]
        ):
            kept = {
                "kernel": saved.model.kernel,
                "dropout": saved.model.dropout,
                "context_length": keys["context_length"],
            }
            as_read = ModelConfig(**keys)
            if saved.model.ff_dim == as_read.ff_dim:
                kept["d_ff"] = saved.model.d_ff  # the same width, spelled as the run spelled it
            if saved.model.kv_heads == as_read.kv_heads:
                kept["n_kv_head"] = saved.model.n_kv_head  # n_head written out, or left out
            if not any(r.table for r in as_read.rows):
                kept["context_length"] = saved.model.context_length
                kept["random_positions"] = saved.model.random_positions
            elif saved.model.position_range == keys["context_length"]:
                # A learned table's rows are the positions it trained on: M of them with random
                # positions, at the run's own (shorter) context.
                kept["context_length"] = saved.model.context_length
                kept["random_positions"] = saved.model.random_positions
            model = ModelConfig(**{**keys, **kept})
            if extends(model.layer_positions):
                spelled = {key: getattr(saved.model, key) for key in ROPE_KEYS}
                try:
                    as_saved = dataclasses.replace(model, **spelled)
                except ConfigError:  # a config of another shape: not this model's spelling
                    as_saved = model
                if rope_parameters(as_saved) == rope_parameters(model):  # the same angles
                    model = as_saved
            return saved.replace(model=model)
    data = DataConfig(tokenizer=str((out / TOKENIZER).resolve()))
    return Config(model=ModelConfig(**keys), data=data)
