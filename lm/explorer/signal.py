"""Each scheme's position signal against the distance ``n = l - j`` from a query back to a key
(notes, "Position tells the model where a matching token occurred"), as the page plots it:

- a bias on the scores (ALiBi, Sandwich, T5, KERPLE, FIRE; FoX's gates and CoPE's counts, which
  read the text): what each layer adds to the last query's score of each key, read from the
  model through ``lm.compare.diagnostics.bias_by_distance``;
- a turn of queries and keys (RoPE and its partial, p-RoPE and extended forms; xPos, PoPE, FoPE,
  HoPE): the score of the fixed pair ``q = k = (1, ..., 1)``, the query ``n`` positions after
  the key at 0, through each layer's own scheme: ``sum_i 2 cos(n theta_i) / sqrt(d_k)`` for RoPE
  (xPos: each term times ``zeta_i^(n/B)``); one line where every layer and head draws the same,
  else one per layer or per head (PoPE's learned offsets and FoPE's drawn series differ by head);
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
from lm.config.names import Place, row
from lm.model.kernels import per_query_head
from lm.model.masks import positions
from lm.model.schemes import reads_content
from lm.model.transformer import TransformerLM


def _layers(model: TransformerLM, place: Place) -> list[int]:
    """The layers whose scheme acts at ``place``."""
    names = model.config.layer_positions
    return [i for i, name in enumerate(names) if row(name).place is place]


def _which(layers: list[int], count: int) -> str:
    return "every layer" if len(layers) == count else "layers " + ", ".join(map(str, layers))


def turned_scores(model: TransformerLM, layer: int, distances: int) -> np.ndarray:
    """``q_n . k_0 / sqrt(width)`` ``[H, distances]`` for ``q = k = (1, ..., 1)``: each query
    head's score of the key at position 0 from a query at ``n``, both turned by ``layer``'s own
    scheme (its ``rotate``), scaled as the kernels scale what it returns."""
    c, attn = model.config, model.blocks[layer].attn
    device = next(model.parameters()).device
    where = positions(c, torch.zeros(1, distances, dtype=torch.long, device=device))
    ones = torch.ones(1, c.n_head, distances, c.head_dim, device=device)
    with torch.no_grad():
        q, k = attn.position.rotate(ones, ones[:, : c.kv_heads], where)
    keys = per_query_head(k, c.n_head)[0, :, 0]  # (H, width): each head's key at position 0
    score = torch.einsum("hnc,hc->hn", q[0].double(), keys.double()) / math.sqrt(q.shape[-1])
    return score.cpu().numpy()


def _turned_chart(model: TransformerLM, distances: int) -> dict | None:
    layers = _layers(model, Place.QUERIES_AND_KEYS)
    if not layers:
        return None
    names = [model.config.layer_positions[i] for i in layers]
    scores = {i: turned_scores(model, i, distances) for i in layers}  # (H, n) each
    first = scores[layers[0]][0]
    if all(np.allclose(y, first) for y in scores.values()):  # RoPE's: one line for all
        series = [{"label": "/".join(dict.fromkeys(names)), "layer": None, "head": None,
                   "y": _list(first)}]  # fmt: skip
    else:  # a line per layer, or per head where a layer's heads differ (PoPE's offsets)
        series = []
        for i, name in zip(layers, names, strict=True):
            y = scores[i]
            same = bool(np.allclose(y, y[0]))
            series += [
                {"label": f"{name}, layer {i}" + ("" if same else f" head {h}"), "layer": i,
                 "head": None if same else h, "y": _list(row)}
                for h, row in enumerate(y[:1] if same else y)
            ]  # fmt: skip
    return {
        "title": f"{'/'.join(dict.fromkeys(names))}: the score of a fixed query-key pair "
        f"(q = k = 1), the query n after the key at 0, "
        f"{_which(layers, model.config.n_layer)} and every head",
        "ylabel": "q_n·k_0 / √width",
        "x": list(range(distances)),
        "series": series,
    }


def _bias_chart(model: TransformerLM, prompt: list[int], long: list[int]) -> dict | None:
    layers = _layers(model, Place.SCORES)
    if not layers:
        return None
    names = [model.config.layer_positions[i] for i in layers]
    reads_text = any(map(reads_content, names))  # drawn on the prompt, not the long text
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
    """Fixed vectors added to the embeddings (not a learned table), read through the scheme's
    ``embed`` of zeros: ``p_n . p_0``, for sinusoids ``sum_i cos(n w_i)``, the same at every l."""
    row = model.config.rows[0]  # a scheme of the embeddings is never chosen per layer
    if row.place is not Place.EMBEDDINGS or row.table:
        return None
    device = next(model.parameters()).device
    ids = torch.zeros(1, distances, dtype=torch.long, device=device)
    where = positions(model.config, ids)  # 0 .. n-1
    with torch.no_grad():
        zeros = torch.zeros(1, distances, model.config.d_model, device=device)
        p = model.pos_embed.embed(zeros, where)[0].double()  # (n, d): p_0 .. p_(n-1)
    y = p @ p[0]
    return {
        "title": f"{row.name}: the inner product of the position vectors n apart, p_l·p_(l−n)",
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
        _turned_chart(model, len(long)),
        _bias_chart(model, prompt, long),
        _sinusoid_chart(model, len(long)),
        _decay_chart(model, maps),
    ]
    return [c for c in charts if c is not None]


def undrawn(model: TransformerLM) -> str:
    """Why a run's positions draw no chart, or nothing to say: every scheme on the queries and
    keys or on the scores is drawn, and sinusoids; ``none`` and a learned table have no function
    of distance."""
    if any(r.place is Place.NOTHING or r.table for r in model.config.rows):
        return "only the causal mask orders the tokens, or a learned table: no function of distance"
    return ""


def _list(values: np.ndarray) -> list[float]:
    return [round(float(v), 6) for v in values]
