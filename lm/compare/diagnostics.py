"""Look inside a trained model: its attention maps over a text, and its attention score as a
function of query-key offset; plus the sinusoid table on its own.

The notes' claim for RoPE ("RoPE compares positions through angle differences") is that a
rotated query-key score depends on the offset ``s - l`` rather than on the positions
themselves. :func:`draw_score_by_offset` measures what a trained model made of that: the pre-softmax
score ``S = q·k / sqrt(d_k)`` (a position bias such as ALiBi's included, as the softmax sees
it), averaged over every query-key pair at each offset, per layer and head.
:func:`bias_by_distance` draws the bias alone, for the schemes that add one to the scores.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lm.compare import plots
from lm.config.errors import LMError
from lm.config.names import Place, row
from lm.data.batches import eval_batches
from lm.data.sources import prepare_data
from lm.data.tokenizer import TextTokenizer
from lm.model.schemes import reads_content
from lm.model.schemes.embeddings import sinusoidal_table
from lm.model.transformer import TransformerLM
from lm.runs.directory import TOKENIZER, check_out_dir
from lm.runs.load import load_run
from lm.runtime.device import seeded_draws


@dataclass
class AttentionPicture:
    weights: np.ndarray
    """The drawn attention matrices ``[heads, T, T]``: rows are queries, columns keys."""
    tokens: list[str]
    layer: int
    heads: list[int]
    path: Path


def _run_title(run_dir: str | Path) -> str:
    """A run's name for a title: its folder and the one above (``position=rope/seed1``)."""
    return "/".join(Path(run_dir).resolve().parts[-2:])


def _byte_symbols() -> dict[str, int]:
    """Byte-level BPE's alphabet: the character that stands for each byte in a token's string
    (printable Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    symbols = {chr(b): b for b in printable}
    symbols.update({chr(256 + n): b for n, b in enumerate(others)})
    return symbols


BYTE_SYMBOLS = _byte_symbols()


def token_text(tokenizer: TextTokenizer, token_id: int) -> str:
    """A token as text for an axis: a byte-level token that is only part of a character (one
    byte of "é") shows its bytes as ``\\xNN`` instead of the replacement character."""
    text = tokenizer.decode([token_id])
    if "\ufffd" not in text:
        return text
    piece = tokenizer.tokenizer.id_to_token(token_id) or ""
    if not piece or any(c not in BYTE_SYMBOLS for c in piece):
        return text  # not a byte-level token: the replacement character is the text itself
    return bytes(BYTE_SYMBOLS[c] for c in piece).decode("utf-8", "backslashreplace")


def picture_path(path: str | Path, flag: str = "--out") -> Path:
    """A file a picture can be written to: a format matplotlib writes (by its suffix), not a
    folder, and no file where a folder above it must be."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.lower().lstrip(".")
    if path.is_dir():
        raise LMError(f"{flag} {path}: is a folder; give a picture file such as {path / 'x.png'}")
    if suffix not in formats:
        raise LMError(
            f"{flag} {path}: {'.' + suffix if suffix else 'no suffix'} is not a picture format "
            f"matplotlib writes; use one of {', '.join(sorted(formats))}"
        )
    check_out_dir(path.parent, flag)
    return path


def _index(name: str, value: int | None, count: int, default: int) -> int:
    if value is None:
        return default
    if not 0 <= value < count:
        raise LMError(f"--{name} {value}: the model has {count} {name}s (0 to {count - 1})")
    return value


def draw_attention(
    run_dir: str | Path,
    text: str,
    layer: int | None = None,
    head: int | None = None,
    out: str | Path | None = None,
    device: str = "cpu",
) -> AttentionPicture:
    """Draw layer ``layer``'s attention over the tokens of ``text``: one head, or all of them.

    The default layer is the last one. The picture goes to ``out`` (default
    ``RUN_DIR/attention.png``).
    """
    path = picture_path(out) if out is not None else None  # before the slow work
    run = load_run(run_dir, device=device)
    path = path or picture_path(Path(run_dir) / "attention.png")
    cfg = run.config.model
    layer = _index("layer", layer, cfg.n_layer, cfg.n_layer - 1)
    heads = list(range(cfg.n_head)) if head is None else [_index("head", head, cfg.n_head, 0)]
    ids = run.tokenizer.encode(text)
    if not ids:
        raise LMError("--text: empty; give the text whose attention to draw")
    unknown = run.tokenizer.count_unknown(text)
    if unknown:
        print(f"lm: {unknown} character(s) of the text became <unk>", file=sys.stderr)
    with seeded_draws(torch.device(device), run.config.train.seed, ids):  # drawn positions
        _, weights = run.model.attention_weights(torch.tensor([ids], device=device))[layer]
    weights = weights[0, heads].float().cpu().numpy()  # (heads, T, T)
    tokens = [token_text(run.tokenizer, i) for i in ids]
    plots.attention_maps(
        weights,
        tokens,
        [f"head {h}" for h in heads],
        path,
        suptitle=f"{_run_title(run_dir)}: {cfg.position_text} positions, layer {layer}",
    )
    return AttentionPicture(weights, tokens, layer, heads, path)


def draw_score_by_offset(
    run_dir: str | Path,
    out: str | Path | None = None,
    windows: int = 16,
    device: str = "cpu",
) -> tuple[np.ndarray, Path]:
    """Mean score at each query-key offset per layer and head, ``[layers, heads, offsets]``, over
    the first ``windows`` validation sequences as evaluation reads them (packed windows, or
    padded examples), drawn to ``out`` (default ``RUN_DIR/score_by_offset.png``). Only pairs
    that training could see count: a real query and a real key of one document, the key not
    after the query; the title says how many pairs an offset averages."""
    path = picture_path(out) if out is not None else None  # before the slow work
    run = load_run(run_dir, device=device)
    path = path or picture_path(Path(run_dir) / "score_by_offset.png")
    cfg = run.config
    C = cfg.model.context_length
    data = prepare_data(cfg.data, tokenizer_path=Path(run_dir) / TOKENIZER, log=None)
    pad = data.tokenizer.pad_id
    batch = next(eval_batches(data.val, cfg.data, C, windows, pad, max_batches=1), None)
    if batch is None or not batch["loss_mask"].any():
        raise LMError(f"{run_dir}: the validation split holds no sequence to read")
    ids, key_mask = batch["input_ids"].to(device), batch["key_mask"].to(device)
    segments = batch["segment_ids"].to(device) if "segment_ids" in batch else None
    seen = key_mask[:, :, None] & key_mask[:, None, :]  # (B, T, T): query and key both real
    if segments is not None:
        seen &= segments[:, :, None] == segments[:, None, :]
    T = ids.shape[1]
    pairs = np.array([int(torch.diagonal(seen, -d, -2, -1).sum()) for d in range(T)])
    T = int(np.flatnonzero(pairs)[-1]) + 1  # offsets no sequence reaches are left out
    profile = np.zeros((cfg.model.n_layer, cfg.model.n_head, T))
    with seeded_draws(ids.device, cfg.train.seed, "val", C):  # drawn positions
        layers = run.model.attention_weights(ids, key_mask, segments)
    for i, (s, _) in enumerate(layers):
        for offset in range(T):
            # The offset-th diagonal below the main one: every (query l, key l - offset) pair.
            diagonal = torch.diagonal(s, offset=-offset, dim1=-2, dim2=-1)  # (B, H, T - offset)
            ok = torch.diagonal(seen, offset=-offset, dim1=-2, dim2=-1)[:, None]  # (B, 1, ...)
            total = torch.where(ok, diagonal, torch.zeros_like(diagonal)).sum(dim=(0, 2))
            profile[i, :, offset] = (total / pairs[offset]).cpu().numpy()
    ylabel = "mean score q·k/√d_k"
    biased = [n for n in dict.fromkeys(cfg.model.layer_positions) if row(n).place is Place.SCORES]
    if biased:  # the softmax sees S plus the bias
        ylabel += f" + {'/'.join(biased)} bias"
    plots.score_by_offset(
        profile,
        path,
        ylabel=ylabel,
        title=f"{_run_title(run_dir)}: {cfg.model.position_text} positions, mean score by offset "
        f"over {len(ids)} validation sequences ({pairs[0]:,} query-key pairs at offset 0, "
        f"{pairs[T - 1]:,} at {T - 1})",
    )
    return profile, path


@torch.no_grad()
def bias_by_distance(model: TransformerLM, ids: torch.Tensor) -> dict[int, np.ndarray]:
    """What each layer's position scheme adds to the scores of the last query of ``ids [1, T]``
    against the keys at distance ``0 .. T - 1`` behind it: ``{layer: [heads, T]}``, for the
    layers whose scheme biases the scores (ALiBi's ``-m_h d``; FoX's and CoPE's, which read the
    text, for this one); each layer's hook given what it reads in a forward pass."""
    inputs: dict[int, tuple] = {}  # each biased layer's input, positions and mask, from a pass
    hooks = [
        block.attn.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args))
        for i, block in enumerate(model.blocks)
        if block.attn.biases
    ]
    try:
        model(ids, kernel="math")
    finally:
        for hook in hooks:
            hook.remove()
    drawn = {}
    for i, (h, where, mask, _) in inputs.items():
        attn = model.blocks[i].attn
        q, k, _ = attn.project(h)  # a scheme of the scores rotates nothing
        if attn.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        bias = attn.position.score_bias(where, mask, h, q, k)  # B: (1, H, T, T)
        drawn[i] = bias[0, :, -1].flip(-1).float().cpu().numpy()  # (H, T): distance 0 first
    return drawn


def draw_bias_by_distance(
    run_dir: str | Path, out: str | Path | None = None, device: str = "cpu"
) -> Path | None:
    """:func:`bias_by_distance` of a run over its trained context, for the first validation
    window, drawn to ``out`` (default ``RUN_DIR/bias_by_distance.png``); None, and nothing
    drawn, when no layer biases scores."""
    path = picture_path(out) if out is not None else None
    run = load_run(run_dir, device=device)
    cfg = run.config
    if all(r.place is not Place.SCORES for r in cfg.model.rows):
        return None
    C = cfg.model.context_length
    data = prepare_data(cfg.data, tokenizer_path=Path(run_dir) / TOKENIZER, log=None)
    batch = next(eval_batches(data.val, cfg.data, C, 1, data.tokenizer.pad_id, max_batches=1))
    real = int(batch["key_mask"][0].sum())  # a window's real tokens
    with seeded_draws(torch.device(device), cfg.train.seed, "val", C):  # drawn positions
        drawn = bias_by_distance(run.model, batch["input_ids"][:, :real].to(device))
    path = path or picture_path(Path(run_dir) / "bias_by_distance.png")
    reads = [n for n in dict.fromkeys(cfg.model.layer_positions) if reads_content(n)]
    of = f", on the first validation window ({' and '.join(reads)} read its text)" if reads else ""
    return plots.score_by_offset(
        np.stack(list(drawn.values())),
        path,
        ylabel="position bias added to the score",
        title=f"{_run_title(run_dir)}: {cfg.model.position_text} bias against distance, "
        f"query at position {real - 1}{of}",
        layers=list(drawn),
    )


def draw_sinusoids(d: int, length: int, out: str | Path) -> Path:
    """The notes' sinusoid table for width ``d`` and ``length`` positions, drawn to ``out``."""
    if d < 2 or d % 2:
        raise LMError(f"--d {d}: sinusoids come in sin/cos pairs; give an even width >= 2")
    if length < 1:
        raise LMError(f"--length {length}: must be at least 1")
    return plots.sinusoids(sinusoidal_table(length, d).numpy(), picture_path(out))
