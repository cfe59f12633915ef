"""lm's weights in the layouts of five Hugging Face ``transformers`` architectures, both ways.

In GPT-2's block (LayerNorm, exact GELU, a key/value head per query head), each position scheme
goes to the architecture that computes exactly what ``TransformerLM`` does (pre-norm blocks,
sequential residual, scores scaled by 1/sqrt(d_k)):

=============  ==========  ===============================================================
lm scheme      target      how
=============  ==========  ===============================================================
rope           GPT-NeoX    sequential residual; q/k rows permuted (below); RoPE's settings
                           as rope_parameters, each checked (lm.hf.rope_parameters)
learned        GPT-2       ``wpe`` = lm's learned table
sinusoidal     GPT-2       ``wpe`` = the notes' sinusoids; ``wte`` = sqrt(d) E, untied head E
                           (``wte`` = E, as lm's, without ``model.scale_embeddings``)
none           GPT-2       ``wpe`` = zeros
alibi          MPT         ``transformers`` always adds MPT's ALiBi bias (slopes checked)
=============  ==========  ===============================================================

The Llama-style block (``model.norm: rmsnorm``, ``model.mlp: swiglu``, any ``model.n_kv_head``)
with RoPE goes to ``LlamaForCausalLM``, and with ``model.qk_norm`` to ``Qwen3ForCausalLM``, whose
QK-norm is lm's: RMSNorm over each head's query and key, a gain per feature, before RoPE. lm's
fused projection holds the query rows of every head, then the key rows and the value rows of
the ``n_kv_head`` key/value heads; they split into ``q_proj``, ``k_proj`` and ``v_proj``, query
and key rows renumbered per head as below, and QK-norm's gains renumbered alike (RMSNorm's mean
of squares does not depend on the order of the features). Any other block is refused in one
line naming the first setting no target computes: ALiBi or a position table with SwiGLU or
RMSNorm, a LayerNorm block with grouped-query heads, a squared-ReLU MLP.

RoPE layouts. The notes rotate interleaved pairs ``(x[2i], x[2i+1])``; GPT-NeoX (and Llama and
Qwen3) rotates ``(x[i], x[i + d_k/2])`` ("rotate half"), with the same angles. Renumbering each
head's query and key features, lm feature ``2i`` -> NeoX ``i`` and ``2i+1`` -> ``i + d_k/2``,
makes NeoX's rotation lm's; the scores are unchanged because queries and keys are renumbered
alike. With partial RoPE (p pairs rotated) the same renumbering acts on the first ``2p``
features, ``d_k/2`` read as ``p``, and the unrotated ones keep their place, where NeoX passes
them through. NeoX also stores its fused projection head by head, ``[H, (q, k, v), d_k]`` rows,
where lm stores ``[(q, k, v), H, d_k]``. (NeoX computes the angles in float32, lm in float64:
the two agree to float32 rounding, which grows slowly with the position.)

ALiBi in transformers' MPT biases each key by its slot alone, ``-m (L - 1 - j)``; for a causal
query ``i`` that differs from lm's ``-m (i - j)`` by a constant of the row, which softmax
ignores. Pads on the left shift every real token's slot alike, so the distances between real
tokens, all that either bias reads, are lm's (which counts positions over real tokens only).

GPT-2's ``Conv1D`` keeps weights as ``[in, out]``: the transpose of ``nn.Linear``. GPT-2 and
GPT-NeoX always have biases; a bias-free lm model exports zeros there, and an import whose
biases are all zero gives a bias-free lm model again. Every step is a permutation, a transpose
or a copy, so an import of an export gives back the very same bits; the one exception is an
untied sinusoidal model, whose E comes back as a table ``E'`` with ``E' sqrt(d) = E sqrt(d)``
bit for bit (the only way lm uses it), since multiplying by sqrt(d) is not one-to-one in floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from lm.config.sections import ModelConfig
from lm.hf.rope_parameters import CannotExpress, check_rope, rope_parameters
from lm.hf.shapes import ARCHITECTURES, LLAMA_STYLE, export_target
from lm.model.schemes.embeddings import sinusoidal_table

_LLAMA_BLOCK = [
    ("norm1", "input_layernorm", "norm"),
    ("attn.qkv", "self_attn.q_proj", "q"),
    ("attn.qkv", "self_attn.k_proj", "k"),
    ("attn.qkv", "self_attn.v_proj", "v"),
    ("attn.out", "self_attn.o_proj", "copy"),
    ("norm2", "post_attention_layernorm", "norm"),
    ("mlp.gate", "mlp.gate_proj", "copy"),
    ("mlp.up", "mlp.up_proj", "copy"),
    ("mlp.down", "mlp.down_proj", "copy"),
]
# Every query/key/value/output/MLP projection and norm of a block: (lm name, HF name, how).
_BLOCK = {
    "gpt2": (
        "transformer.h.{i}.",
        [
            ("norm1", "ln_1", "copy"),
            ("attn.qkv", "attn.c_attn", "conv1d"),
            ("attn.out", "attn.c_proj", "conv1d"),
            ("norm2", "ln_2", "copy"),
            ("mlp.up", "mlp.c_fc", "conv1d"),
            ("mlp.down", "mlp.c_proj", "conv1d"),
        ],
    ),
    "gpt_neox": (
        "gpt_neox.layers.{i}.",
        [
            ("norm1", "input_layernorm", "copy"),
            ("attn.qkv", "attention.query_key_value", "neox_qkv"),
            ("attn.out", "attention.dense", "copy"),
            ("norm2", "post_attention_layernorm", "copy"),
            ("mlp.up", "mlp.dense_h_to_4h", "copy"),
            ("mlp.down", "mlp.dense_4h_to_h", "copy"),
        ],
    ),
    "mpt": (
        "transformer.blocks.{i}.",
        [
            ("norm1", "norm_1", "copy"),
            ("attn.qkv", "attn.Wqkv", "copy"),
            ("attn.out", "attn.out_proj", "copy"),
            ("norm2", "norm_2", "copy"),
            ("mlp.up", "ffn.up_proj", "copy"),
            ("mlp.down", "ffn.down_proj", "copy"),
        ],
    ),
    "llama": ("model.layers.{i}.", _LLAMA_BLOCK),
    "qwen3": (
        "model.layers.{i}.",
        [
            *_LLAMA_BLOCK[:4],
            ("attn.q_norm", "self_attn.q_norm", "gains"),
            ("attn.k_norm", "self_attn.k_norm", "gains"),
            *_LLAMA_BLOCK[4:],
        ],
    ),
}
_FINAL_NORM = {
    "gpt2": "transformer.ln_f",
    "gpt_neox": "gpt_neox.final_layer_norm",
    "mpt": "transformer.norm_f",
    "llama": "model.norm",
    "qwen3": "model.norm",
}
_EMBED = {
    "gpt2": "transformer.wte.weight",
    "gpt_neox": "gpt_neox.embed_in.weight",
    "mpt": "transformer.wte.weight",
    "llama": "model.embed_tokens.weight",
    "qwen3": "model.embed_tokens.weight",
}
# GPT-NeoX files name the head embed_out (transformers 5 too, when it saves); lm_head is read too.
_HEAD = {
    "gpt2": ("lm_head.weight",),
    "gpt_neox": ("embed_out.weight", "lm_head.weight"),
    "mpt": ("lm_head.weight",),
    "llama": ("lm_head.weight",),
    "qwen3": ("lm_head.weight",),
}
_WPE = "transformer.wpe.weight"
_ROPE_DEFAULTS = {
    "rope_base": 10000.0,
    "rope_scaling": None,
    "rope_fraction": 1.0,
    "rope_original_context": None,
}
# Whether the target always has biases (lm's bias-free model exports zeros there); Llama's and
# Qwen3's are switched on by attention_bias and mlp_bias, and their norms have none.
_HAS_BIAS = {"gpt2": True, "gpt_neox": True, "mpt": False, "llama": False, "qwen3": False}


@dataclass(frozen=True)
class HFModel:
    """A model in a ``transformers`` layout: its ``model_type``, config keys and tensors."""

    model_type: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    legacy: dict[str, Any] = field(default_factory=dict)
    """Keys older transformers versions read instead (added to config.json as they are)."""


# ---------------------------------------------------------------------------------------------
# The fused projection of GPT-NeoX


def _rotate_half_order(head_dim: int, rotated: int) -> torch.Tensor:
    """NeoX feature j holds lm feature order[j]: of the first ``rotated`` features the evens
    (pair firsts), then the odds; the unrotated features after them, in place."""
    return torch.cat(
        [torch.arange(0, rotated, 2), torch.arange(1, rotated, 2), torch.arange(rotated, head_dim)]
    )


def _qkv_to_neox(t: torch.Tensor, n_head: int, rotated: int) -> torch.Tensor:
    """lm rows ``[(q, k, v), H, d_k]`` -> NeoX rows ``[H, (q, k, v), d_k]``, q and k renumbered."""
    rest = t.shape[1:]
    parts = t.reshape(3, n_head, -1, *rest)  # (3, H, d_k, ...)
    order = _rotate_half_order(parts.shape[2], rotated)
    q, k, v = parts[0][:, order], parts[1][:, order], parts[2]
    return torch.stack([q, k, v], dim=1).reshape(-1, *rest)  # (H, 3, d_k, ...) flattened


def _qkv_from_neox(t: torch.Tensor, n_head: int, rotated: int) -> torch.Tensor:
    rest = t.shape[1:]
    parts = t.reshape(n_head, 3, -1, *rest)  # (H, 3, d_k, ...)
    back = torch.argsort(_rotate_half_order(parts.shape[2], rotated))
    q, k, v = parts[:, 0][:, back], parts[:, 1][:, back], parts[:, 2]
    return torch.stack([q, k, v], dim=0).reshape(-1, *rest)


@dataclass(frozen=True)
class Heads:
    """What the layouts renumber: query heads, key/value heads, their width, and the features
    of each head that RoPE rotates."""

    n_head: int
    kv_heads: int
    head_dim: int
    rotated: int

    def rows(self, part: str) -> tuple[int, int, int]:
        """lm's fused projection ``[(H + 2 H_kv) d_k, ...]``: where query, key or value rows
        start, how many heads they hold, and their end."""
        q, kv = self.n_head * self.head_dim, self.kv_heads * self.head_dim
        start, heads = {"q": (0, self.n_head), "k": (q, self.kv_heads), "v": (q + kv, 0)}[part]
        return start, heads, start + (q if part == "q" else kv)


def _to_hf(how: str, t: torch.Tensor, heads: Heads) -> torch.Tensor:
    """``heads.rotated``: the features of each head RoPE rotates (the query/key renumbering)."""
    if how == "conv1d" and t.dim() == 2:
        return t.t()
    if how == "neox_qkv":
        return _qkv_to_neox(t, heads.n_head, heads.rotated)
    order = _rotate_half_order(heads.head_dim, heads.rotated)
    if how in ("q", "k", "v"):
        start, n, end = heads.rows(how)
        rows = t[start:end]
        if not n:  # values are not rotated
            return rows
        return rows.unflatten(0, (n, heads.head_dim))[:, order].flatten(0, 1)
    if how == "gains":  # QK-norm's gain per feature of a head
        return t[order]
    return t


def _from_hf(how: str, t: torch.Tensor, heads: Heads) -> torch.Tensor:
    """One HF tensor in lm's layout: ``q``, ``k`` and ``v`` give their rows of lm's fused
    projection, which the caller joins in that order."""
    if how == "conv1d" and t.dim() == 2:
        return t.t()
    if how == "neox_qkv":
        return _qkv_from_neox(t, heads.n_head, heads.rotated)
    back = torch.argsort(_rotate_half_order(heads.head_dim, heads.rotated))
    if how in ("q", "k"):
        return t.unflatten(0, (-1, heads.head_dim))[:, back].flatten(0, 1)
    if how == "gains":
        return t[back]
    return t


def _block_names(model_type: str, n_layer: int) -> list[tuple[str, str, str]]:
    """(lm tensor, HF tensor, how) for every weight and bias of the blocks and the final norm;
    RMSNorm's and QK-norm's gains have no bias."""
    prefix, pairs = _BLOCK[model_type]
    final = "norm" if model_type in LLAMA_STYLE else "copy"
    names = []
    for i in range(n_layer):
        for lm_name, hf_name, how in pairs:
            for kind in ("weight",) if how in ("norm", "gains") else ("weight", "bias"):
                lm_full = f"blocks.{i}.{lm_name}.{kind}"
                names.append((lm_full, prefix.format(i=i) + f"{hf_name}.{kind}", how))
    for kind in ("weight",) if final == "norm" else ("weight", "bias"):
        names.append((f"norm.{kind}", f"{_FINAL_NORM[model_type]}.{kind}", final))
    return names


# ---------------------------------------------------------------------------------------------
# lm -> transformers


def to_hf(
    cfg: ModelConfig, state: dict[str, torch.Tensor], max_positions: int, ids: dict[str, int]
) -> HFModel:
    """lm's ``state_dict`` as the target architecture's tensors and config keys (fp32).

    ``max_positions`` is the longest sequence the export accepts (its position table or
    ALiBi/RoPE range); ``ids`` holds ``pad``, ``eos`` (lm's ``<eod>``).
    """
    model_type = export_target(cfg)
    d = cfg.d_model
    heads = Heads(cfg.n_head, cfg.kv_heads, cfg.head_dim, 2 * cfg.rope_pairs)
    tensors: dict[str, torch.Tensor] = {}
    for lm_name, hf_name, how in _block_names(model_type, cfg.n_layer):
        if lm_name in state or not lm_name.endswith(".bias"):  # every weight is lm's
            tensors[hf_name] = _to_hf(how, state[lm_name], heads)
        elif _HAS_BIAS[model_type] and lm_name.endswith(".bias"):
            weight = state[lm_name.removesuffix("bias") + "weight"]
            weight = _to_hf(how, weight, heads)
            out_dim = weight.shape[-1] if how == "conv1d" else weight.shape[0]
            tensors[hf_name] = torch.zeros(out_dim, dtype=weight.dtype)

    embed, head = state["embed.weight"], state["head.weight"]
    tied = cfg.tie_embeddings
    if cfg.position == "sinusoidal" and cfg.scale_embeddings:
        # lm computes E[w] * sqrt(d) + p; GPT-2 computes wte[w] + wpe[p]. The same product,
        # rounded the same way, stored in wte; the head keeps the unscaled E.
        tensors[_EMBED[model_type]] = embed * math.sqrt(d)
        tied = False
    else:
        tensors[_EMBED[model_type]] = embed
    if cfg.position == "sinusoidal":
        tensors[_WPE] = sinusoidal_table(max_positions, d)
    elif cfg.position == "learned":
        tensors[_WPE] = state["pos_embed.weight"]
    elif cfg.position == "none":
        tensors[_WPE] = torch.zeros(max_positions, d)
    if not tied:
        tensors[_HEAD[model_type][0]] = head
    config = _target_config(cfg, model_type, max_positions, tied, ids)
    legacy = {}
    if "rope_parameters" in config:
        # transformers 4 reads these (GPT-NeoX without them would rotate a quarter of each head,
        # unscaled). transformers 5 reads rope_scaling before rope_parameters: the same dict.
        rope = config["rope_parameters"]
        legacy = {"rope_theta": rope["rope_theta"]}
        if model_type == "gpt_neox":
            legacy["rotary_pct"] = rope["partial_rotary_factor"]
            legacy["rotary_emb_base"] = rope["rope_theta"]
        if rope["rope_type"] != "default":
            legacy["rope_scaling"] = dict(rope)
        _check_rope_export(cfg, model_type, {**config, **legacy})
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    return HFModel(model_type, config, tensors, legacy)


def _check_rope_export(cfg: ModelConfig, model_type: str, keys: dict[str, Any]) -> None:
    """Refuse, in one line naming lm's settings, a RoPE model that transformers would rotate
    otherwise when it reads a config.json holding ``keys``."""
    from transformers import AutoConfig

    changed = [
        f"model.{key}: {getattr(cfg, key)}"
        for key, default in _ROPE_DEFAULTS.items()
        if getattr(cfg, key) != default
    ]
    what = f"{', '.join(changed) or 'RoPE'} cannot be exported exactly"
    check_rope(cfg, AutoConfig.for_model(model_type, **keys), what)


def _target_config(
    cfg: ModelConfig, model_type: str, max_positions: int, tied: bool, ids: dict[str, int]
) -> dict[str, Any]:
    common = {
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": tied,
        "bos_token_id": ids["eos"],  # lm has no BOS: every document follows an <eod>
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        "architectures": [ARCHITECTURES[model_type]],
    }
    if model_type == "gpt2":
        return {
            **common,
            "n_positions": max_positions,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_inner": cfg.ff_dim,
            "activation_function": "gelu",  # exact erf GELU, as lm's MLP
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.dropout,
            "layer_norm_epsilon": cfg.norm_eps,
            "scale_attn_weights": True,
        }
    if model_type == "gpt_neox":
        return {
            **common,
            "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head,
            "intermediate_size": cfg.ff_dim,
            "hidden_act": "gelu",
            "max_position_embeddings": max_positions,
            "layer_norm_eps": cfg.norm_eps,
            "use_parallel_residual": False,
            "attention_bias": True,
            "attention_dropout": cfg.dropout,
            "hidden_dropout": cfg.dropout,
            "rope_parameters": rope_parameters(cfg),
        }
    if model_type in LLAMA_STYLE:
        return _llama_style_config(cfg, model_type, max_positions, common)
    return {
        **common,
        "d_model": cfg.d_model,
        "n_heads": cfg.n_head,
        "n_layers": cfg.n_layer,
        "expansion_ratio": 4,
        "max_seq_len": max_positions,
        "layer_norm_epsilon": cfg.norm_eps,
        "learned_pos_emb": False,
        "no_bias": True,
        # transformers' MPT takes attn_pdrop (its one dropout) as an integer only; lm's dropout
        # is kept in resid_pdrop, which it records but does not apply. Only training sees it.
        "resid_pdrop": cfg.dropout,
        "emb_pdrop": cfg.dropout,
        "attn_config": {"alibi": True, "alibi_bias_max": 8, "attn_type": "multihead_attention"},
    }


def _llama_style_config(
    cfg: ModelConfig, model_type: str, max_positions: int, common: dict[str, Any]
) -> dict[str, Any]:
    """Llama's or Qwen3's config keys; lm's ``bias`` is their biases of every projection."""
    rope = rope_parameters(cfg)
    del rope["partial_rotary_factor"]  # whole heads rotate (the export refused any other)
    keys = {
        **common,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,  # Qwen3's default is 128, not d_model / n_head
        "intermediate_size": cfg.ff_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": cfg.norm_eps,
        "attention_bias": cfg.bias,
        "attention_dropout": cfg.dropout,
        "rope_parameters": rope,
    }
    if model_type == "llama":
        return {**keys, "mlp_bias": cfg.bias, "pretraining_tp": 1}
    return {**keys, "use_sliding_window": False, "layer_types": ["full_attention"] * cfg.n_layer}


# ---------------------------------------------------------------------------------------------
# transformers -> lm


def from_hf(
    where: str, config: Any, tensors: dict[str, torch.Tensor], shape: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """ModelConfig keys (``position``, ``bias``, ``tie_embeddings``, ``context_length`` added to
    ``shape``'s) and lm's ``state_dict`` in float32, from a transformers model's tensors."""
    model_type = config.model_type
    tensors = {_strip(model_type, k): v for k, v in tensors.items()}
    n_head, d = shape["n_head"], shape["d_model"]
    keys = {k: v for k, v in shape.items() if k != "max_positions"}
    rotated = round(shape.get("rope_fraction", 1.0) * (d // n_head))
    heads = Heads(n_head, shape.get("n_kv_head") or n_head, d // n_head, rotated)
    names = _block_names(model_type, shape["n_layer"])
    state, keys["bias"] = _block_state(where, tensors, names, heads)

    wte = _take(where, tensors, _EMBED[model_type]).float()
    head_name = next((h for h in _HEAD[model_type] if h in tensors), None)
    if head_name is None and not getattr(config, "tie_word_embeddings", True):
        raise CannotExpress(f"{where}: untied embeddings but no {_HEAD[model_type][0]} tensor")
    head = _take(where, tensors, head_name).float() if head_name is not None else wte

    position = {"gpt2": "learned", "mpt": "alibi"}.get(model_type, "rope")
    if model_type == "mpt" and _WPE in tensors:
        raise CannotExpress(f"{where}: MPT with learned positions as well as ALiBi")
    if model_type == "gpt2":
        wpe = _take(where, tensors, _WPE)
        if not bool(wpe.any()):
            position = "none"
        elif torch.equal(wpe, sinusoidal_table(wpe.shape[0], d).to(wpe.dtype)):
            position = "sinusoidal"
        else:
            state["pos_embed.weight"] = wpe.float()

    embed = wte
    if position == "sinusoidal":
        # lm's sqrt(d) E[w] + p if an untied wte is sqrt(d) E bit for bit; else E[w] + p.
        exact = tensors[_EMBED[model_type]].dtype == torch.float32
        embed = None if torch.equal(wte, head) else _unscale(wte, math.sqrt(d), head, exact)
        if embed is None:
            embed, keys["scale_embeddings"] = wte, False
    keys["tie_embeddings"] = torch.equal(embed, head)
    state["embed.weight"] = embed
    state["head.weight"] = embed if keys["tie_embeddings"] else head
    keys.update(position=position, context_length=shape["max_positions"])
    return keys, state


def _take(where: str, tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in tensors:
        raise CannotExpress(f"{where}: the weights have no {name}")
    return tensors[name]


def _block_state(
    where: str, tensors: dict[str, torch.Tensor], names: list[tuple[str, str, str]], heads: Heads
) -> tuple[dict[str, torch.Tensor], bool]:
    """lm's tensors of the blocks and the final norm from the HF ones ``names`` pairs them with,
    and whether the model has biases. All-zero biases are what a bias-free lm model exports;
    any other bias makes a biased model (a bias the file lacks is zero there)."""
    # Each lm tensor from its HF parts (Llama's q_proj, k_proj and v_proj rows join in order).
    parts: dict[str, list[torch.Tensor]] = {}
    for lm_name, hf_name, how in names:
        if hf_name in tensors or not lm_name.endswith(".bias"):
            piece = _from_hf(how, _take(where, tensors, hf_name).float(), heads)
            parts.setdefault(lm_name, []).append(piece)
    joined = {name: torch.cat(pieces) for name, pieces in parts.items()}
    state = {name: t for name, t in joined.items() if not name.endswith(".bias")}
    biases = {name: t for name, t in joined.items() if name.endswith(".bias")}
    bias = any(bool(b.any()) for b in biases.values())
    for lm_name, _, _ in names:
        if bias and lm_name.endswith(".bias") and lm_name not in state:
            weight = state[lm_name.removesuffix("bias") + "weight"]
            state[lm_name] = biases.get(lm_name, torch.zeros(weight.shape[0]))
    return state, bias


def _strip(model_type: str, name: str) -> str:
    """Older GPT-2 files name their tensors without the ``transformer.`` prefix."""
    if model_type == "gpt2" and not name.startswith(("transformer.", "lm_head.")):
        return "transformer." + name
    return name


def _unscale(
    scaled: torch.Tensor, scale: float, head: torch.Tensor, exact: bool
) -> torch.Tensor | None:
    """E such that lm's ``E * scale`` gives back ``scaled`` bit for bit (the head's E if it does);
    None where no float32 table does.

    Division does not always invert a float multiplication exactly; then a neighbouring float
    of the quotient does. Weights saved in half precision were rounded already (``exact``
    false): there the quotient is kept where no neighbour is exact.
    """
    if head.shape == scaled.shape and torch.equal(head * scale, scaled):
        return head
    guess = scaled / scale
    result, done = guess, guess * scale == scaled
    for direction in (math.inf, -math.inf):
        neighbour = torch.nextafter(guess, torch.full_like(guess, direction))
        fixed = ~done & (neighbour * scale == scaled)
        result, done = torch.where(fixed, neighbour, result), done | fixed
    return None if exact and not bool(done.all()) else result
