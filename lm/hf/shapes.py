"""Which ``transformers`` architecture a model is, both ways: the target an lm config exports as
(or the one line saying why none computes it), and the lm config keys of a ``transformers``
config (or the one line naming the first key lm's model cannot express). The tensors
themselves move in :mod:`lm.hf.weights`, whose docstring gives each scheme's target and
layout."""

from __future__ import annotations

import math
from typing import Any

import torch

from lm.config.names import Place
from lm.config.sections import ModelConfig
from lm.config.values import value_text
from lm.hf import MODELS
from lm.hf.rope_parameters import CannotExpress, refuse, rope_keys
from lm.model.schemes.biases import alibi_slopes

TARGETS = {
    "rope": "gpt_neox",
    "learned": "gpt2",
    "sinusoidal": "gpt2",
    "none": "gpt2",
    "alibi": "mpt",
}
ARCHITECTURES = {model_type: architecture for model_type, (_, architecture) in MODELS.items()}
LLAMA_STYLE = ("llama", "qwen3")
"""The targets of the Llama-style block: RMSNorm, SwiGLU, grouped-query attention, RoPE."""


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
        embedded = any(r.place is Place.EMBEDDINGS for r in cfg.rows)
        table = " (and no position table)" if embedded else ""
        raise CannotExpress(
            f"model.position: {cfg.position} {with_first} cannot be exported: the targets of "
            f"that block, Llama and Qwen3, rotate with RoPE{table}; GPT-2's block (layernorm, "
            "gelu, a key/value head per query head) exports with other schemes"
        )
    if cfg.norm != "rmsnorm":
        raise CannotExpress(
            f"model.norm: {cfg.norm} {with_first} cannot be exported: Llama and Qwen3, the "
            "targets of grouped-query heads, QK-norm and SwiGLU, have RMSNorm norms"
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


def _refuse_lm_only_blocks(cfg: ModelConfig) -> None:
    """Attention-only blocks and smeared keys (Olsson et al. 2022) are refused: every target has
    an MLP in each block and keys of their own token. (Llama with ``intermediate_size: 0``
    computes a zero MLP, but lm writes no such model.)"""
    if cfg.mlp == "none" or cfg.smear_keys:
        key = "model.mlp: none" if cfg.mlp == "none" else "model.smear_keys: true"
        raise CannotExpress(
            f"{key} cannot be exported: every transformers architecture lm writes has an MLP in "
            "each block and keys of their own token (no attention-only block, no smeared keys)"
        )


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
    _refuse_lm_only_blocks(cfg)
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


# ---------------------------------------------------------------------------------------------
# transformers -> lm


def _expect(where: str, config: Any, key: str, wanted: Any, why: str) -> None:
    value = getattr(config, key, None)
    if value != wanted:
        raise refuse(where, key, value, why)


def model_shape(where: str, config: Any) -> dict[str, Any]:
    """ModelConfig keys from a transformers config, refusing what lm's model cannot express.

    Checks go in the order a reader meets the architecture: type, norm, activation, residual,
    heads, positions; the first mismatch is the one reported.
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise CannotExpress(
            f"{where}: model_type {model_type!r} is not one lm imports: lm's model is the GPT-2, "
            "GPT-NeoX or MPT shape (LayerNorm, exact GELU MLP, one key/value head per query "
            "head) or the Llama and Qwen3 shape (RMSNorm, SwiGLU, grouped-query heads, RoPE)"
        )
    shapes = {"gpt2": _gpt2_shape, "gpt_neox": _gpt_neox_shape, "mpt": _mpt_shape}
    return shapes.get(model_type, _llama_style_shape)(where, config)


def _gpt2_shape(where: str, config: Any) -> dict[str, Any]:
    """ModelConfig keys of a GPT-2 config: lm's block (the weights say which positions)."""
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


def _gpt_neox_shape(where: str, config: Any) -> dict[str, Any]:
    """ModelConfig keys of a GPT-NeoX config: lm's block with RoPE, its settings checked."""
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


def _mpt_shape(where: str, config: Any) -> dict[str, Any]:
    """ModelConfig keys of an MPT config: lm's block with ALiBi, bias-free, its slopes lm's."""
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
        types = set(getattr(config, "layer_types", None) or ["full_attention"])
        if types != {"full_attention"}:
            raise refuse(where, "layer_types", sorted(types), "lm's Qwen3 block reads every key")
    heads, d = config.num_attention_heads, config.hidden_size
    head_dim = getattr(config, "head_dim", None) or d // heads
    if head_dim * heads != d:
        why = f"lm's heads are d_model / n_head = {d // heads} wide"
        raise refuse(where, "head_dim", head_dim, why)
    if head_dim % 2:
        raise refuse(where, "head_dim", head_dim, "RoPE needs an even head width")
    kv = getattr(config, "num_key_value_heads", None) or heads
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
