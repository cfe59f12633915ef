"""Each scheme's position signal against the distance ``n = l - j`` from a query back to a key
(notes, "Position tells the model where a matching token occurred"), as the page plots it:

- a bias on the scores (ALiBi, Sandwich, T5, KERPLE, FIRE; FoX's gates and CoPE's counts, which
  read the text): what each layer adds to the last query's score of each key, read from the
  model through ``lm.compare.diagnostics.bias_by_distance``;
- a rotation of queries and keys (RoPE and its partial, p-RoPE and extended forms; xPos): the
  score ``q . R(n theta) k / sqrt(d_k)`` of the fixed pair ``q = k = (1, ..., 1)`` as the offset
  grows, ``sum_i 2 cos(n theta_i) / sqrt(d_k)`` for RoPE (xPos: each term times
  ``zeta_i^(n/B)``), rotated by the model's own angles;
- the other schemes that turn queries and keys (PoPE, FoPE, HoPE): the same pair's score, the
  query ``n`` positions after the key at 0, through the layer's own scheme (PoPE's learned
  offsets and FoPE's drawn series differ by head, so each head has its line);
- sinusoids added to the embeddings: ``p_l . p_(l-n) = sum_i cos(n w_i)``;
- stick-breaking in place of the softmax: the last query's weight of the key ``n`` back, the
  decay it learned, on the text.

Each chart is ``{"title", "ylabel", "x": [n ...], "series": [{"label", "layer", "head", "y"}]}``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from lm.compare.diagnostics import bias_by_distance
from lm.config.names import ROTARY, SCHEMES, Place
from lm.model.kernels import per_query_head
from lm.model.position import CONTENT_BIASES
from lm.model.position.embeddings import sinusoidal_table
from lm.model.position.rope import RopeAngles, rotate_pairs, xpos_decay
from lm.model.transformer import TransformerLM

CONTENT = CONTENT_BIASES
"""Score biases that read the text: drawn on the prompt, not on the longer text."""


def _layers(model: TransformerLM, names: tuple[str, ...] | None, place: str) -> list[int]:
    return [
        i
        for i, name in enumerate(model.config.layer_positions)
        if (name in names if names else SCHEMES[name].place.value == place)
    ]


def _which(layers: list[int], count: int) -> str:
    return "every layer" if len(layers) == count else "layers " + ", ".join(map(str, layers))


def rotary_score(model: TransformerLM, distances: int) -> np.ndarray:
    """``q . R(n theta) k / sqrt(d_k)`` for ``q = k = 1`` at ``n = 0 .. distances - 1``: the
    query rotated at position n, the key at 0, by the run's RoPE angles (xPos's scales too)."""
    c = model.config
    positions = torch.arange(distances)
    cos, sin = RopeAngles.of(c).cos_sin(positions, torch.float64)  # (n, d_k/2)
    if "xpos" in c.layer_positions:
        scale = xpos_decay(c.head_dim) ** (positions.double()[:, None] / c.xpos_scale_base)
        cos, sin = cos * scale, sin * scale  # the query's zeta^(n/B); the key's at 0 is 1
    ones = torch.ones(distances, c.head_dim, dtype=torch.float64)
    q = rotate_pairs(ones, cos, sin)
    return (q @ ones[0] / math.sqrt(c.head_dim)).numpy()


def _rotary_chart(model: TransformerLM, distances: int) -> dict | None:
    layers = _layers(model, ROTARY, "")
    if not layers:
        return None
    names = "/".join(dict.fromkeys(model.config.layer_positions[i] for i in layers))
    y = rotary_score(model, distances)
    return {
        "title": f"{names}: the score of a fixed query-key pair (q = k = 1) as the offset grows, "
        f"{_which(layers, model.config.n_layer)} and every head",
        "ylabel": "q·R(nθ)k / √d_k",
        "x": list(range(distances)),
        "series": [{"label": names, "layer": None, "head": None, "y": _list(y)}],
    }


def turned_scores(model: TransformerLM, layer: int, distances: int) -> np.ndarray:
    """``q_n . k_0 / sqrt(width)`` ``[H, distances]`` for ``q = k = (1, ..., 1)``: each query
    head's score of the key at position 0 from a query at ``n``, both turned by ``layer``'s own
    scheme (its ``rotate``), scaled as the kernels scale what it returns."""
    c, attn = model.config, model.blocks[layer].attn
    device = next(model.parameters()).device
    plan = model.plan(torch.zeros(1, distances, dtype=torch.long, device=device), kernel="math")
    ones = torch.ones(1, c.n_head, distances, c.head_dim, device=device)
    with torch.no_grad():
        q, k = attn.position.rotate(ones, ones[:, : c.kv_heads], plan.at_window(attn.window))
    keys = per_query_head(k, c.n_head)[0, :, 0]  # (H, width): each head's key at position 0
    score = torch.einsum("hnc,hc->hn", q[0].double(), keys.double()) / math.sqrt(q.shape[-1])
    return score.cpu().numpy()


def _turned_chart(model: TransformerLM, distances: int) -> dict | None:
    turning = tuple(
        n for n, row in SCHEMES.items() if row.place is Place.QUERIES_AND_KEYS and n not in ROTARY
    )
    layers = _layers(model, turning, "")
    if not layers:
        return None
    series = []
    for i in layers:
        y = turned_scores(model, i, distances)
        same = bool(np.allclose(y, y[:1]))  # HoPE's: one line for every head
        name = model.config.layer_positions[i]
        series += [
            {"label": f"{name}, layer {i}" + ("" if same else f" head {h}"), "layer": i,
             "head": None if same else h, "y": _list(row)}
            for h, row in enumerate(y[:1] if same else y)
        ]  # fmt: skip
    names = "/".join(dict.fromkeys(model.config.layer_positions[i] for i in layers))
    return {
        "title": f"{names}: the score of a fixed query-key pair (q = k = 1), the query n after "
        f"the key at 0, through each layer's scheme, {_which(layers, model.config.n_layer)}",
        "ylabel": "q_n·k_0 / √width",
        "x": list(range(distances)),
        "series": series,
    }


def _bias_chart(model: TransformerLM, prompt: list[int], long: list[int]) -> dict | None:
    layers = _layers(model, None, "scores")
    if not layers:
        return None
    names = [model.config.layer_positions[i] for i in layers]
    reads_text = any(n in CONTENT for n in names)
    ids = prompt if reads_text else long
    drawn = bias_by_distance(model, torch.tensor([ids], device=next(model.parameters()).device))
    series = [
        {"label": f"layer {i} head {h}", "layer": i, "head": h, "y": _list(row)}
        for i, heads in drawn.items()
        for h, row in enumerate(heads)
    ]
    text = "the prompt" if reads_text else f"a text of {len(ids)} tokens"
    return {
        "title": f"{'/'.join(dict.fromkeys(names))}: the bias added to the last query's score "
        f"of the key n back, on {text}",
        "ylabel": "bias added to the score",
        "x": list(range(len(ids))),
        "series": series,
    }


def _sinusoid_chart(model: TransformerLM, distances: int) -> dict | None:
    if model.config.layer_positions[0] != "sinusoidal":
        return None
    table = sinusoidal_table(distances, model.config.d_model).double()
    y = table @ table[0]  # p_n . p_0 = sum_i cos(n w_i), the same at every l
    return {
        "title": "sinusoidal: the inner product of the position vectors n apart, p_l·p_(l−n)",
        "ylabel": "p_l·p_(l−n)",
        "x": list(range(distances)),
        "series": [{"label": "sinusoids", "layer": None, "head": None, "y": _list(y)}],
    }


def _decay_chart(model: TransformerLM, maps: np.ndarray) -> dict | None:
    if model.config.normalize != "stick_breaking":
        return None
    last = maps[:, :, -1, ::-1]  # (L, H, T): the last query's weights, distance 0 first
    series = [
        {"label": f"layer {i} head {h}", "layer": i, "head": h, "y": _list(last[i, h])}
        for i in range(last.shape[0])
        for h in range(last.shape[1])
    ]
    return {
        "title": "stick-breaking: the last query's weight of the key n back, on the prompt",
        "ylabel": "attention weight",
        "x": list(range(last.shape[-1])),
        "series": series,
    }


def signal_charts(
    model: TransformerLM, prompt: list[int], long: list[int], maps: np.ndarray
) -> list[dict]:
    """Every chart of the run's position signal against distance (none for ``none`` positions
    and a learned table: they have no function of distance to draw)."""
    charts = [
        _rotary_chart(model, len(long)),
        _turned_chart(model, len(long)),
        _bias_chart(model, prompt, long),
        _sinusoid_chart(model, len(long)),
        _decay_chart(model, maps),
    ]
    return [c for c in charts if c is not None]


def undrawn(model: TransformerLM) -> str:
    """Why a run's schemes draw no chart, or say nothing: ``none`` and a learned table have no
    function of distance; a scheme this page does not know yet is named."""
    names = dict.fromkeys(model.config.layer_positions)
    drawn = (Place.QUERIES_AND_KEYS, Place.SCORES)  # and of the embeddings, sinusoids
    known = {"sinusoidal", "none", "learned"}
    new = [n for n in names if SCHEMES[n].place not in drawn and n not in known]
    if new:
        return f"{', '.join(new)}: its signal against distance is not drawn on this page yet"
    if names.keys() & {"none", "learned"}:
        return "only the causal mask orders the tokens, or a learned table: no function of distance"
    return ""


def _list(values: np.ndarray) -> list[float]:
    return [round(float(v), 6) for v in values]
