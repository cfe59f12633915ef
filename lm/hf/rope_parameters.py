"""RoPE's settings as transformers' ``rope_parameters`` (GPT-NeoX's; Llama and Qwen3 read the
same, less ``partial_rotary_factor``), both ways, each checked
against the frequencies transformers itself computes.

==================  ============================================================  ==============
lm                  transformers                                                   exact
==================  ============================================================  ==============
``rope_base`` B     ``rope_theta`` B                                               always
``pi:S``            ``rope_type: linear``, ``factor`` S: frequencies / S, the       always
                    same angles as lm's positions / S
``ntk:S``           ``rope_theta`` B S^(d/(d-2)), ``rope_type: default``            always
``yarn:S``          ``rope_type: yarn``, ``factor`` S, ``original_max_position_     where the
                    embeddings`` L (lm's ``rope_original_context``, default the     ramps agree
                    trained context)                                               (below)
``rope_fraction``   ``partial_rotary_factor`` 2p/d_k, p the pairs rotated           always
==================  ============================================================  ==============

NTK-aware. lm's ``ntk:S`` is a fixed base (``lm.model.schemes.rope.ntk_base``). transformers'
``dynamic`` type is another model: it keeps the base B up to ``max_position_embeddings`` and grows
it with the sequence after, so lm exports the fixed base as ``rope_theta``, which every version of
transformers computes, and refuses ``dynamic`` on import.

Partial rotary. lm rotates the interleaved pairs of the first ``2p`` features of a head; GPT-NeoX
rotates its first ``rotary_ndims = int(d_k * partial_rotary_factor)`` features in rotate-half
order and passes the rest through. The query and key rows of those ``2p`` features are renumbered
as for full rotary (``lm.hf.weights``), the others keep their place; both use ``base^(-2i/2p)``.

YaRN. Both scale cos and sin by ``0.1 ln S + 1`` and use the paper's bounds (a pair that turns
more than 32 times over L keeps its frequency, one that turns less than once is divided by S).
Between them lm follows the paper: the weight is linear in the turns ``r``. transformers follows
the YaRN authors' code: linear in the pair *index* between the indices where r = 32 and r = 1,
floored and ceiled, and the lower one clamped at pair 0, which is then never scaled. The two
agree only when no pair turns between 1 and 32 times over L and the fastest turns at least 32
times: heads of few pairs with a long L. So every export and every import compares the two per
pair, transformers' own ``GPTNeoXRotaryEmbedding`` against
``lm.model.schemes.rope.RopeAngles``, and refuses a difference in one line naming the first pair
that differs.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import torch

from lm.config.errors import ConfigError, LMError
from lm.config.sections import ModelConfig
from lm.model.schemes.rope import RopeAngles, ntk_base

ROPE_KEYS = ("rope_base", "rope_scaling", "rope_fraction", "rope_original_context")
"""lm's RoPE settings, which :func:`rope_parameters` writes as transformers' ``rope_parameters``."""

WHAT_LM_COMPUTES = (
    "lm computes rope_type default (any rope_theta; NTK-aware scaling exports as one), linear "
    "(Position Interpolation), and yarn where transformers' ramp gives lm's frequencies"
)


class CannotExpress(LMError):
    """A model one side cannot compute exactly as the other does."""


def factor_text(factor: float) -> str:
    """A factor as ``model.rope_scaling`` writes it (``4``, ``2.5``); it reads back as the same
    float."""
    short = f"{factor:g}"
    return short if float(short) == factor else repr(factor)


def partial_rotary_factor(head_dim: int, pairs: int) -> float:
    """The ``partial_rotary_factor`` whose ``int(head_dim * factor)`` (how transformers counts
    the rotated features) is ``2 * pairs``: ``2p / d_k``, or the next float up when that product
    rounds below ``2p``."""
    factor = 2 * pairs / head_dim
    if int(head_dim * factor) != 2 * pairs:
        factor = math.nextafter(factor, math.inf)
    return factor


def rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
    """config.json's ``rope_parameters`` for RoPE model ``cfg`` (see the module's table)."""
    params: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": cfg.rope_base,
        "partial_rotary_factor": partial_rotary_factor(cfg.head_dim, cfg.rope_pairs),
    }
    if cfg.rope_factor == 1.0:  # any method at factor 1 is the plain rotation
        return params
    if cfg.rope_method == "pi":
        params.update(rope_type="linear", factor=cfg.rope_factor)
    elif cfg.rope_method == "ntk":
        params["rope_theta"] = ntk_base(cfg.rope_base, cfg.rope_factor, 2 * cfg.rope_pairs)
    elif cfg.rope_method == "yarn":
        params.update(
            rope_type="yarn",
            factor=cfg.rope_factor,
            original_max_position_embeddings=cfg.rope_context,
        )
    return params


def rope_keys(where: str, config: Any) -> dict[str, Any]:
    """lm's RoPE keys (``rope_base``, ``rope_scaling``, ``rope_fraction``,
    ``rope_original_context``) from a GPT-NeoX, Llama or Qwen3 config; what lm cannot compute
    is refused in one line, and what it can is checked pair by pair against transformers' own
    frequencies."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", "default")
    head_dim = config.hidden_size // config.num_attention_heads
    fraction = params.get("partial_rotary_factor", 1.0)
    rotated = int(head_dim * fraction)
    if rotated < 2 or rotated % 2:
        raise refuse(
            where,
            "partial_rotary_factor",
            fraction,
            f"it rotates {rotated} of the {head_dim} features of a head; lm rotates whole pairs "
            "(an even number of features, at least 2)",
        )
    keys: dict[str, Any] = {
        "rope_base": float(params.get("rope_theta", 10000.0)),
        "rope_fraction": 1.0 if rotated == head_dim else rotated / head_dim,
    }
    if rope_type == "linear":
        keys["rope_scaling"] = f"pi:{factor_text(float(params['factor']))}"
    elif rope_type == "yarn":
        keys["rope_scaling"] = f"yarn:{factor_text(float(params['factor']))}"
        keys["rope_original_context"] = int(params["original_max_position_embeddings"])
    elif rope_type == "dynamic":
        raise refuse(
            where,
            "rope_type",
            rope_type,
            "transformers' dynamic NTK grows the base with the sequence length; lm's ntk:S is a "
            f"fixed base, exported as rope_theta ({WHAT_LM_COMPUTES})",
        )
    elif rope_type != "default":
        raise refuse(where, "rope_type", rope_type, WHAT_LM_COMPUTES)
    try:
        model = ModelConfig(d_model=config.hidden_size, n_head=config.num_attention_heads, **keys)
    except ConfigError as e:
        raise CannotExpress(f"{where}: {e}") from None
    check_rope(model, config, f"{where}: rope_parameters {_describe(params)}")
    return keys


ROTARY_CLASSES = {
    "gpt_neox": "gpt_neox.modeling_gpt_neox:GPTNeoXRotaryEmbedding",
    "llama": "llama.modeling_llama:LlamaRotaryEmbedding",
    "qwen3": "qwen3.modeling_qwen3:Qwen3RotaryEmbedding",
}
"""Where transformers computes each RoPE target's frequencies, under ``transformers.models``."""


def check_rope(cfg: ModelConfig, config: Any, what: str) -> None:
    """Refuse, in one line starting with ``what``, when transformers' model with ``config``
    (GPT-NeoX, Llama or Qwen3) rotates queries and keys otherwise than lm's model ``cfg``:
    another number of rotated pairs, another frequency for one of them, or another factor on
    cos and sin."""
    module, name = ROTARY_CLASSES[config.model_type].split(":")
    rotary_class = getattr(importlib.import_module(f"transformers.models.{module}"), name)
    rotary = rotary_class(config)
    theirs, their_scale = rotary.inv_freq.double(), float(rotary.attention_scaling)
    ours, scales = lm_frequencies(cfg)
    pairs = cfg.rope_pairs
    rotated = int(cfg.head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))
    if len(theirs) != pairs or rotated != 2 * pairs:
        raise CannotExpress(
            f"{what}: transformers rotates {rotated} features of each head, lm {2 * pairs}"
        )
    # transformers computes the frequencies in float32, lm in float64: they agree to ~1e-7.
    close = torch.isclose(theirs, ours, rtol=1e-5, atol=0.0)
    if not bool(close.all()):
        i = int((~close).nonzero()[0])
        why = ""
        if config.rope_parameters.get("rope_type") == "yarn":
            why = (
                " (its YaRN ramp is linear in the pair index and leaves pair 0 unscaled; lm's "
                f"is linear in the turns over the {cfg.rope_context}-token context, as the "
                "paper's; they agree only when no pair turns 1 to 32 times over it)"
            )
        raise CannotExpress(
            f"{what}: transformers gives pair {i} of {pairs} the frequency {theirs[i]:.6g} where "
            f"lm gives {ours[i]:.6g}{why}"
        )
    if not all(math.isclose(s, their_scale, rel_tol=1e-6) for s in scales[:pairs].tolist()):
        raise CannotExpress(
            f"{what}: transformers scales cos and sin by {their_scale:.6g}, lm by "
            f"{float(scales[0]):.6g}"
        )
    if not all(math.isclose(s, 1.0, rel_tol=1e-6) for s in scales[pairs:].tolist()):
        raise CannotExpress(
            f"{what}: lm scales the {cfg.head_dim - 2 * pairs} unrotated features of each head "
            f"by YaRN's factor {float(scales[pairs]):.6g} as well (the paper's temperature "
            "scales every logit); transformers passes them through unscaled"
        )


def lm_frequencies(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The angle each rotated pair turns per position, ``[rope_pairs]``, and the factor on cos
    and sin of every pair, ``[head_dim / 2]`` (float64), as lm's model computes them: read from
    ``RopeAngles.cos_sin`` at positions 0 and 1, so Position Interpolation (which divides positions)
    counts like a frequency."""
    rope = RopeAngles(
        cfg.head_dim,
        cfg.rope_base,
        None if cfg.rope_fraction == 1.0 else cfg.rope_pairs,
        cfg.rope_method,
        cfg.rope_factor,
        cfg.rope_context,
    )
    cos, sin = rope.cos_sin(torch.tensor([0.0, 1.0], dtype=torch.float64), torch.float64)
    scales = cos[0]  # at position 0 every angle is 0: cos is the factor itself
    angles = torch.atan2(sin[1], cos[1])  # every frequency is at most 1 < pi: no wrap-around
    return angles[: cfg.rope_pairs], scales


def _describe(params: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in sorted(params.items())) + "}"


def refuse(where: str, key: str, value: Any, why: str) -> CannotExpress:
    return CannotExpress(f"{where}: {key}={value!r}: {why}; lm cannot compute this model exactly")
