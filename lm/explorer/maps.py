"""A run's attention maps over a text, and what the page measures of them: each head's entropy,
the histogram of attended distances, maps pooled small enough to draw at 4x the context, the
signed scores before normalization, and each head's scores on a repeated probe (induction heads:
Olsson et al. 2022, "In-context Learning and Induction Heads").

The maps are ``lm``'s own numbers: the notes' ``A = softmax_row(S + M)`` (or the run's
``model.normalize``) through the explicit kernel, read from the model in :func:`attention_maps`,
the one place this wing asks the model for them.
"""

from __future__ import annotations

import base64

import numpy as np
import torch

from lm.data.tokenizer import TextTokenizer
from lm.evaluate_heads import head_scores, probe
from lm.model.transformer import TransformerLM

DECIMALS = 4
"""Digits of every weight the page holds and shows."""
SCORE_DECIMALS = 3
"""Digits of every signed score ``S + B + M`` the page holds and shows."""


@torch.no_grad()
def both_maps(model: TransformerLM, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Every layer's and head's scores ``S + B + M`` and attention ``A`` over ``ids``, each
    ``[layers, heads, T, T]`` (rows are queries, columns keys), float64."""
    device = next(model.parameters()).device
    layers = model.attention_weights(torch.tensor([ids], device=device))
    scores = np.stack([s[0].double().cpu().numpy() for s, _ in layers])
    return scores, np.stack([w[0].double().cpu().numpy() for _, w in layers])


def attention_maps(model: TransformerLM, ids: list[int]) -> np.ndarray:
    """Every layer's and head's attention matrix over ``ids``, ``[layers, heads, T, T]``."""
    return both_maps(model, ids)[1]


def signed_rows(scores: np.ndarray) -> list[list[list[list[float | None]]]]:
    """The scores as the page holds them: like :func:`rows`, to :data:`SCORE_DECIMALS` digits,
    a masked entry (``-inf``: outside a window, another document) as None."""
    T = scores.shape[-1]
    return [
        [
            [[float(s) if np.isfinite(s) else None for s in head[q, : q + 1]] for q in range(T)]
            for head in np.round(layer, SCORE_DECIMALS)
        ]
        for layer in scores
    ]


@torch.no_grad()
def head_grid(model: TransformerLM, tokenizer: TextTokenizer, seed: int) -> dict[str, list]:
    """Four scores per head, ``{name: [[score per head] per layer]}``: what ``lm heads`` reports
    (previous-token, induction, duplicate-token and first-token; ``lm.evaluate_heads``), on its
    probe of random ordinary tokens written twice, drawn from ``seed``."""
    ids = probe(tokenizer, model.config.context_length, seed)
    return head_scores(model, ids, seed)


def rows(maps: np.ndarray) -> list[list[list[list[float]]]]:
    """The maps as the page holds them: for each layer and head, each query's weights of the
    keys it may read (keys ``0 .. query``, the causal mask's lower triangle), to
    :data:`DECIMALS` digits."""
    rounded = np.round(maps, DECIMALS)
    T = maps.shape[-1]
    return [
        [[[float(w) for w in head[q, : q + 1]] for q in range(T)] for head in layer]
        for layer in rounded
    ]


def entropy(maps: np.ndarray) -> np.ndarray:
    """Each head's attention entropy ``-sum_j a_lj ln a_lj`` in nats, averaged over its queries:
    0 when every query reads one key, ``ln(l + 1)`` when query l spreads evenly. ``[L, H]``."""
    safe = np.where(maps > 0, maps, 1.0)
    return -(maps * np.log(safe)).sum(-1).mean(-1)


def distance_edges(length: int) -> list[int]:
    """Bucket edges of attended distance ``l - j``: 0, 1, 2-3, 4-7, ... (powers of two), up to
    ``length - 1``. Bucket b holds distances ``edges[b] .. edges[b + 1] - 1``."""
    edges = [0, 1]
    while edges[-1] < length:
        edges.append(edges[-1] * 2)
    return edges


def distance_histogram(maps: np.ndarray, edges: list[int]) -> np.ndarray:
    """The attention weight each head puts at each bucket of distance, averaged over queries:
    ``[L, H, buckets]``, each head's buckets summing to 1."""
    T = maps.shape[-1]
    by_distance = np.stack(
        [np.diagonal(maps, -d, -2, -1).sum(-1) for d in range(T)], axis=-1
    )  # (L, H, T): the weight mass at distance d over every query
    out = np.zeros((*maps.shape[:2], len(edges) - 1))
    for b in range(len(edges) - 1):
        out[..., b] = by_distance[..., edges[b] : min(edges[b + 1], T)].sum(-1)
    return out / T


def pooled(maps: np.ndarray, cells: int = 256) -> tuple[list[list[str]], int]:
    """The maps shrunk to at most ``cells`` rows and columns, for drawing: blocks of ``b x b``
    queries and keys become one cell holding the block's mean row of summed weights (so a
    pooled row still sums to 1), stored as ``round(255 sqrt(w))`` bytes, base64, per head.
    Returns the pictures and ``b``."""
    L, H, T, _ = maps.shape
    b = -(-T // cells)
    n = -(-T // b)
    padded = np.zeros((L, H, n * b, n * b))
    padded[..., :T, :T] = maps
    blocks = padded.reshape(L, H, n, b, n, b).sum(axis=5).mean(axis=3)  # (L, H, n, n)
    scaled = np.round(255 * np.sqrt(np.clip(blocks, 0, 1))).astype(np.uint8)
    return [[base64.b64encode(head.tobytes()).decode() for head in layer] for layer in scaled], b
