"""Decoding: greedy by default (the notes' next-token prediction), temperature/top-k on request.

Several prompts decode together as one left-padded batch; positions count real tokens only and
padded keys are masked, so each row continues exactly as its prompt would alone. A KV cache keeps
every layer's keys and values, so each new token costs one position's work instead of the whole
prefix. Past ``context_length`` every scheme works the same way: each new token is predicted
from the last ``context_length`` tokens, recomputed, so with or without the cache the text is
the same.
"""

from __future__ import annotations

import torch

from lm.model import KVCache, TransformerLM


def _choose(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """Next token per row from last-position logits ``[B, V]``."""
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: TransformerLM,
    prompts: list[list[int]],
    max_new_tokens: int,
    pad_id: int,
    eod_id: int | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
    use_cache: bool = True,
) -> list[list[int]]:
    """The new token ids for each prompt (stopping early at ``eod_id``, which is not returned)."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    model.eval()
    device = next(model.parameters()).device
    C = model.config.context_length
    B, S = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, S), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros(B, S, dtype=torch.bool, device=device)
    for i, p in enumerate(prompts):  # left padding: every row's last token is in the last column
        ids[i, S - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, S - len(p) :] = True
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)

    out: list[list[int]] = [[] for _ in prompts]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    cache: KVCache | None = None
    for _ in range(max_new_tokens):
        S = ids.shape[1]
        if use_cache and S <= C:
            if cache is None:
                cache = KVCache(model, B, C)
                logits = model(ids, key_mask=mask, cache=cache)
            else:
                logits = model(ids[:, -1:], key_mask=mask[:, -1:], cache=cache)
        else:  # beyond the context (or no cache): recompute over the last C slots
            logits = model(ids[:, -C:], key_mask=mask[:, -C:])
        nxt = _choose(logits[:, -1], temperature, top_k, generator)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        # One host copy per step for the whole batch (indexing the device tensor per row would
        # copy once per row).
        for row, token, finished in zip(out, nxt.tolist(), done.tolist(), strict=True):
            if not finished and token != eod_id:
                row.append(token)
        # A finished row keeps receiving masked pads, which no real query ever sees.
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, ~done[:, None]], dim=1)
        if eod_id is not None:
            done = done | (nxt == eod_id)
            if bool(done.all()):
                break
    return out
