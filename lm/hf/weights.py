"""lm's weights in the layouts of five Hugging Face ``transformers`` architectures, both ways.

In GPT-2's block (LayerNorm, exact GELU, a key/value head per query head), each position scheme
goes to the architecture that computes exactly what ``TransformerLM`` does (pre-norm blocks,
sequential residual, scores scaled by 1/sqrt(d_k)):

=============  ==========  ===============================================================
lm scheme      target      how
=============  ==========  ===============================================================
rope           GPT-NeoX    sequential residual; q/k rows permuted (below); RoPE's settings
                           as rope_parameters, each checked (lm.hf.rope)
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
from lm.config.values import value_text
from lm.hf.rope import CannotExpress, check_rope, refuse, rope_keys, rope_parameters
from lm.model.position.biases import alibi_slopes
from lm.model.position.embeddings import sinusoidal_table

TARGETS = {
    "rope": "gpt_neox",
    "learned": "gpt2",
    "sinusoidal": "gpt2",
    "none": "gpt2",
    "alibi": "mpt",
}
ARCHITECTURES = {
    "gpt2": "GPT2LMHeadModel",
    "gpt_neox": "GPTNeoXForCausalLM",
    "mpt": "MptForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
LLAMA_STYLE = ("llama", "qwen3")
"""The targets of the Llama-style block: RMSNorm, SwiGLU, grouped-query attention, RoPE."""
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


def mpt_slopes(n_head: int) -> torch.Tensor:
    """The slopes transformers' MPT gives each head (read from its own bias function)."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    bias = build_mpt_alibi_tensor(n_head, 2, alibi_bias_max=8)  # (H, 1, 2): [-m_h, 0]
    return -bias[:, 0, 0].float()


def _block_settings(cfg: ModelConfig) -> list[str]:
    """The settings that make ``cfg``'s block other than GPT-2's, as a config writes them."""
    settings = []
    if cfg.norm != "layernorm":
        settings.append(f"model.norm: {cfg.norm}")
    if cfg.mlp != "gelu":
        settings.append(f"model.mlp: {cfg.mlp}")
    if cfg.kv_heads != cfg.n_head:
        settings.append(f"model.n_kv_head: {cfg.kv_heads}")
    if cfg.qk_norm:
        settings.append("model.qk_norm: true")
    return settings


def _llama_style_target(cfg: ModelConfig, settings: list[str]) -> str:
    """Llama for the Llama-style block with RoPE, Qwen3 with QK-norm; any other combination of
    the block's settings is refused naming the one no target computes."""
    with_first = f"with {settings[0]}"
    if cfg.mlp == "relu2":
        raise CannotExpress(
            "model.mlp: relu2 cannot be exported: no transformers architecture lm writes has a "
            "squared-ReLU MLP (GPT-2's block: gelu; Llama's and Qwen3's: swiglu)"
        )
    if cfg.position != "rope":
        table = " (and no position table)" if cfg.position in ("learned", "sinusoidal") else ""
        raise CannotExpress(
            f"model.position: {cfg.position} {with_first} cannot be exported: the targets of "
            f"that block, Llama and Qwen3, rotate with RoPE{table}; GPT-2's block (layernorm, "
            "gelu, a key/value head per query head) exports with other schemes"
        )
    if cfg.norm != "rmsnorm":
        raise CannotExpress(
            f"model.norm: {cfg.norm} {with_first} cannot be exported: Llama and Qwen3, the "
            "targets of grouped-query heads, QK-norm and SwiGLU, normalize with RMSNorm"
        )
    if cfg.mlp != "swiglu":
        raise CannotExpress(
            f"model.mlp: {cfg.mlp} {with_first} cannot be exported: Llama and Qwen3, the "
            "targets of RMSNorm, grouped-query heads and QK-norm, have a swiglu MLP"
        )
    if cfg.rope_fraction != 1.0:
        raise CannotExpress(
            f"model.rope_fraction: {cfg.rope_fraction} cannot be exported: Llama and Qwen3 "
            "rotate every feature of a head"
        )
    if cfg.qk_norm and cfg.bias:
        raise CannotExpress(
            "model.bias: true with model.qk_norm cannot be exported: Qwen3 (the QK-norm target) "
            "has no biases in its MLP"
        )
    return "qwen3" if cfg.qk_norm else "llama"


def export_target(cfg: ModelConfig) -> str:
    """The ``model_type`` ``cfg`` exports as; a model every target would compute differently is
    refused in one line (RoPE's settings: :func:`_check_rope_export`, once the config is
    known)."""
    if not isinstance(cfg.position, str):
        raise CannotExpress(
            f"model.position: {cfg.position_text} sets a scheme per layer, and cannot be "
            f"exported: the transformers targets use one in every layer"
        )
    if cfg.position not in TARGETS:
        raise CannotExpress(
            f"model.position: {cfg.position} cannot be exported: no transformers architecture "
            f"computes it (lm exports {', '.join(TARGETS)})"
        )
    if cfg.normalize != "softmax":
        raise CannotExpress(
            f"model.normalize: {cfg.normalize} cannot be exported: the transformers targets "
            "normalize scores with the softmax"
        )
    if any(w is not None for w in cfg.layer_windows):  # [null, null] reads every key
        raise CannotExpress(
            f"model.window: {value_text(cfg.window)} cannot be exported: the transformers "
            "targets lm writes read every key"
        )
    if cfg.random_positions_eval:
        raise CannotExpress(
            "model.random_positions_eval: true cannot be exported: the model draws its positions "
            "at every pass, and the transformers targets read positions 0, 1, 2, ..."
        )
    if cfg.rope_p != 1.0:
        raise CannotExpress(
            f"model.rope_p: {cfg.rope_p} cannot be exported: GPT-NeoX's partial rotary re-spaces "
            "the frequencies of the pairs it rotates; p-RoPE keeps the notes' frequencies"
        )
    settings = _block_settings(cfg)
    if settings:
        return _llama_style_target(cfg, settings)
    if cfg.position == "alibi":
        if cfg.bias:
            raise CannotExpress(
                "model.bias: true cannot be exported: the ALiBi target (transformers' MPT) has "
                "no biases in its projections or norms"
            )
        if cfg.ff_dim != 4 * cfg.d_model:
            raise CannotExpress(
                f"model.d_ff: {cfg.ff_dim} cannot be exported: transformers' MPT (the ALiBi "
                f"target) always has an MLP of 4 x d_model = {4 * cfg.d_model}"
            )
        ours, theirs = alibi_slopes(cfg.n_head), mpt_slopes(cfg.n_head)
        if not torch.allclose(ours, theirs, rtol=1e-6, atol=0.0):
            raise CannotExpress(
                f"model.n_head: {cfg.n_head} heads cannot be exported: transformers' MPT gives "
                f"them ALiBi slopes {theirs.tolist()}, lm {ours.tolist()}"
            )
    return TARGETS[cfg.position]


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


def _get(config: Any, name: str, default: Any = None) -> Any:
    return getattr(config, name, default)


def _expect(where: str, config: Any, key: str, wanted: Any, why: str) -> None:
    value = _get(config, key)
    if value != wanted:
        raise refuse(where, key, value, why)


def model_shape(where: str, config: Any) -> dict[str, Any]:
    """ModelConfig keys from a transformers config, refusing what lm's model cannot express.

    Checks go in the order a reader meets the architecture: type, norm, activation, residual,
    heads, positions; the first mismatch is the one reported.
    """
    model_type = _get(config, "model_type")
    if model_type not in ARCHITECTURES:
        raise CannotExpress(f"{where}: model_type {model_type!r}{_why_not(config)}")
    if model_type == "gpt2":
        _expect(where, config, "activation_function", "gelu", "lm's MLP uses exact (erf) GELU")
        _expect(where, config, "scale_attn_weights", True, "lm scales scores by 1/sqrt(d_k)")
        _expect(where, config, "scale_attn_by_inverse_layer_idx", False, "lm has no layer scale")
        _expect(where, config, "add_cross_attention", False, "lm is decoder-only")
        return {
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "d_model": config.n_embd,
            "d_ff": _ff(config.n_inner, config.n_embd),
            "norm_eps": config.layer_norm_epsilon,
            "dropout": float(config.resid_pdrop),
            "max_positions": config.n_positions,
        }
    if model_type == "gpt_neox":
        _expect(where, config, "hidden_act", "gelu", "lm's MLP uses exact (erf) GELU")
        _expect(where, config, "use_parallel_residual", False, "lm's residual is sequential")
        heads, d = config.num_attention_heads, config.hidden_size
        if (d // heads) % 2:
            raise refuse(where, "head_dim", d // heads, "RoPE needs an even head width")
        return {
            "n_layer": config.num_hidden_layers,
            "n_head": heads,
            "d_model": d,
            "d_ff": _ff(config.intermediate_size, d),
            "norm_eps": config.layer_norm_eps,
            "dropout": float(config.hidden_dropout),
            **rope_keys(where, config),
            "max_positions": config.max_position_embeddings,
        }
    if model_type in LLAMA_STYLE:
        return _llama_style_shape(where, config)
    attn = config.attn_config
    for key, wanted, why in (
        ("attn_type", "multihead_attention", "lm has one key/value head per query head"),
        ("alibi", True, "transformers' MPT always adds ALiBi"),
        ("alibi_bias_max", 8, "lm's ALiBi slopes are the paper's (bias max 8)"),
        ("clip_qkv", None, "lm does not clip queries, keys and values"),
        ("qk_ln", False, "lm has no query/key norm"),
        ("prefix_lm", False, "lm's attention is causal"),
    ):
        _expect(where, attn, key, wanted, why)
    heads, d = config.n_heads, config.d_model
    if attn.softmax_scale not in (None, 1 / math.sqrt(d // heads)):
        raise refuse(where, "softmax_scale", attn.softmax_scale, "lm scales by 1/sqrt(d_k)")
    _expect(where, config, "logit_scale", None, "lm does not scale its logits")
    if not torch.allclose(alibi_slopes(heads), mpt_slopes(heads), rtol=1e-6, atol=0.0):
        raise refuse(where, "n_heads", heads, "MPT's ALiBi slopes for it differ from lm's")
    return {
        "n_layer": config.n_layers,
        "n_head": heads,
        "d_model": d,
        "d_ff": _ff(int(config.expansion_ratio * d), d),
        "norm_eps": config.layer_norm_epsilon,
        "dropout": float(attn.attn_pdrop or config.resid_pdrop),  # see _target_config
        "max_positions": config.max_seq_len,
    }


def _llama_style_shape(where: str, config: Any) -> dict[str, Any]:
    """ModelConfig keys of a Llama or Qwen3 config: lm's Llama-style block, QK-norm for Qwen3."""
    _expect(where, config, "hidden_act", "silu", "lm's SwiGLU gates with SiLU")
    if config.model_type == "llama":
        _expect(where, config, "pretraining_tp", 1, "lm computes each projection in one matmul")
    else:
        _expect(where, config, "use_sliding_window", False, "lm's Qwen3 block reads every key")
        types = set(_get(config, "layer_types") or ["full_attention"])
        if types != {"full_attention"}:
            raise refuse(where, "layer_types", sorted(types), "lm's Qwen3 block reads every key")
    heads, d = config.num_attention_heads, config.hidden_size
    head_dim = _get(config, "head_dim") or d // heads
    if head_dim * heads != d:
        why = f"lm's heads are d_model / n_head = {d // heads} wide"
        raise refuse(where, "head_dim", head_dim, why)
    if head_dim % 2:
        raise refuse(where, "head_dim", head_dim, "RoPE needs an even head width")
    kv = _get(config, "num_key_value_heads") or heads
    return {
        "n_layer": config.num_hidden_layers,
        "n_head": heads,
        "n_kv_head": None if kv == heads else kv,
        "d_model": d,
        "d_ff": _ff(config.intermediate_size, d, "swiglu"),
        "norm": "rmsnorm",
        "mlp": "swiglu",
        "qk_norm": config.model_type == "qwen3",
        "norm_eps": config.rms_norm_eps,
        "dropout": float(config.attention_dropout),
        **rope_keys(where, config),
        "max_positions": config.max_position_embeddings,
    }


def _ff(width: int | None, d_model: int, mlp: str = "gelu") -> int | None:
    """lm's ``d_ff``: None stands for its default width (4 x d_model; for SwiGLU 2/3 of it,
    rounded up to a multiple of 8)."""
    default = ModelConfig(d_model=d_model, n_head=1, mlp=mlp).ff_dim
    return None if width is None or width == default else width


def _why_not(config: Any) -> str:
    """What lm imports, for the one-line refusal of another architecture."""
    return (
        " is not one lm imports: lm's model is the GPT-2, GPT-NeoX or MPT shape (LayerNorm, "
        "exact GELU MLP, one key/value head per query head) or the Llama and Qwen3 shape "
        "(RMSNorm, SwiGLU, grouped-query heads, RoPE)"
    )


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

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise CannotExpress(f"{where}: the weights have no {name}")
        return tensors[name].float()

    # Each lm tensor from its HF parts (Llama's q_proj, k_proj and v_proj rows join in order).
    parts: dict[str, list[torch.Tensor]] = {}
    for lm_name, hf_name, how in _block_names(model_type, shape["n_layer"]):
        if hf_name in tensors or not lm_name.endswith(".bias"):
            parts.setdefault(lm_name, []).append(_from_hf(how, take(hf_name), heads))
    joined = {name: torch.cat(pieces) for name, pieces in parts.items()}
    state = {name: t for name, t in joined.items() if not name.endswith(".bias")}
    biases = {name: t for name, t in joined.items() if name.endswith(".bias")}
    # All-zero biases are what a bias-free lm model exports; any other bias makes a biased model.
    keys["bias"] = any(bool(b.any()) for b in biases.values())
    if keys["bias"]:
        for lm_name, _, _ in _block_names(model_type, shape["n_layer"]):
            if lm_name.endswith(".bias") and lm_name not in state:
                weight = state[lm_name.removesuffix("bias") + "weight"]
                state[lm_name] = biases.get(lm_name, torch.zeros(weight.shape[0]))

    wte = take(_EMBED[model_type])
    head_name = next((h for h in _HEAD[model_type] if h in tensors), None)
    if head_name is None and not _get(config, "tie_word_embeddings", True):
        raise CannotExpress(f"{where}: untied embeddings but no {_HEAD[model_type][0]} tensor")
    head = take(head_name) if head_name is not None else wte

    position = {"gpt2": "learned", "mpt": "alibi"}.get(model_type, "rope")
    context = shape["max_positions"]
    if model_type == "mpt" and "transformer.wpe.weight" in tensors:
        raise CannotExpress(f"{where}: MPT with learned positions as well as ALiBi")
    if model_type == "gpt2":
        wpe = tensors[_WPE]
        if not bool(wpe.any()):
            position = "none"
        elif torch.equal(wpe, sinusoidal_table(wpe.shape[0], d).to(wpe.dtype)):
            position = "sinusoidal"
        else:
            state["pos_embed.weight"] = wpe.float()

    embed = wte
    if position == "sinusoidal" and not torch.equal(wte, head):
        # lm's sqrt(d) E[w] + p when wte is sqrt(d) times a table (bit for bit); else E[w] + p.
        exact = tensors[_EMBED[model_type]].dtype == torch.float32
        try:
            embed = _unscale(where, wte, math.sqrt(d), head, exact)
        except CannotExpress:
            keys["scale_embeddings"] = False
    elif position == "sinusoidal":
        keys["scale_embeddings"] = False
    keys["tie_embeddings"] = torch.equal(embed, head)
    state["embed.weight"] = embed
    state["head.weight"] = embed if keys["tie_embeddings"] else head
    keys.update(position=position, context_length=context)
    return keys, state


def _strip(model_type: str, name: str) -> str:
    """Older GPT-2 files name their tensors without the ``transformer.`` prefix."""
    if model_type == "gpt2" and not name.startswith(("transformer.", "lm_head.")):
        return "transformer." + name
    return name


def _unscale(
    where: str, scaled: torch.Tensor, scale: float, head: torch.Tensor, exact: bool
) -> torch.Tensor:
    """E such that lm's ``E * scale`` gives back ``scaled`` bit for bit (the head's E if it does).

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
    if exact and not bool(done.all()):
        raise CannotExpress(f"{where}: the token embedding is not sqrt(d) times a float32 table")
    return result
