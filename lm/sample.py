"""Decoding: greedy by default (the notes' next-token prediction), temperature/top-k on request.

Several prompts decode together as one left-padded batch; positions count real tokens only and
padded keys are masked, so each row continues exactly as its prompt would alone. A KV cache keeps
every layer's keys and values, so each new token costs one position's work instead of the whole
prefix. Past ``context_length`` every scheme works the same way: each new token is predicted
from the last ``context_length`` tokens, recomputed, so with or without the cache the text is
the same.

On a GPU the model runs under bf16 autocast (where supported; fp32 on CPUs). New tokens stay on
the device in one preallocated buffer: the host reads it once at the end (and checks whether
every row has ended only every ``DONE_CHECK_EVERY`` tokens). With a seed, each prompt draws from
its own generator seeded from the seed and the prompt's tokens, so a prompt's continuation is
the same alone, anywhere in a batch, and whatever its neighbours; identical prompts in one
batch therefore sample identically. A model drawing its positions at evaluation
(``model.random_positions_eval``) draws them at every pass from the seed and the prompts: the
same call decodes the same text.

The one-token step has fixed shapes whatever the step (the cache's slots are preallocated and
written at a device-side index), so ``compile_step`` compiles it as one graph: no graph break,
and at most one recompilation as the cache fills (``tests/test_sample.py`` counts them).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable

import torch

from lm.model.cache import KVCache
from lm.model.transformer import TransformerLM
from lm.runtime.device import autocast_context, compile_model, seeded_draws

DONE_CHECK_EVERY = 16  # tokens between host reads of "has every row ended?"


def prompt_generators(
    prompts: list[list[int]], seed: int, device: torch.device
) -> list[torch.Generator]:
    """One generator per prompt, seeded from ``seed`` and the prompt's tokens (not its index,
    so reordering or regrouping prompts changes no continuation)."""
    generators = []
    for p in prompts:
        digest = hashlib.sha256(f"{seed}:{','.join(map(str, p))}".encode()).digest()
        seed_p = int.from_bytes(digest[:8], "little") & (2**63 - 1)
        generators.append(torch.Generator(device=device).manual_seed(seed_p))
    return generators


def _next_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    generators: list[torch.Generator] | None,
) -> torch.Tensor:
    """Next token per row from last-position logits ``[B, V]``; row i draws from
    ``generators[i]`` when given (else the global generator)."""
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if generators is None:
        return torch.multinomial(probs, 1).squeeze(-1)
    pairs = zip(probs, generators, strict=True)
    rows = [torch.multinomial(p[None], 1, generator=g) for p, g in pairs]  # (1, 1) each
    return torch.cat(rows).squeeze(-1)


def _position_draws(
    model: TransformerLM, prompts: list[list[int]], seed: int | None, device: torch.device
) -> Callable[[int], contextlib.AbstractContextManager]:
    """Each pass's seeding of the positions a model draws at evaluation
    (``model.random_positions_eval``): from ``seed``, the prompts and the pass, so that the same
    call decodes the same text, greedy or seeded (the draws depend on the batch)."""
    if not model.config.random_positions_eval:
        return lambda step: contextlib.nullcontext()
    key = hashlib.sha256(repr((seed, prompts)).encode()).hexdigest()
    return lambda step: seeded_draws(device, key, step)


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
    compile_step: bool = False,
) -> list[list[int]]:
    """The new token ids for each prompt (stopping early at ``eod_id``, which is not returned).
    ``compile_step`` runs the one-token KV-cache step through ``torch.compile`` (whole graph)."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    model.eval()
    device = next(model.parameters()).device
    S = max(len(p) for p in prompts)
    # Every slot the decoding will use, preallocated: (B, S + max_new_tokens).
    ids = torch.full((len(prompts), S + max_new_tokens), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, p in enumerate(prompts):  # left padding: every row's last token is in column S - 1
        ids[i, S - len(p) : S] = torch.tensor(p, dtype=torch.long)
        mask[i, S - len(p) : S] = True
    generators = None if seed is None else prompt_generators(prompts, seed, device)
    draws = _position_draws(model, prompts, seed, device)
    # bf16 autocast (and cache) on GPUs that support it; CPUs decode in the model's own dtype.
    bf16 = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    autocast = autocast_context(device, bf16 or torch.float32)
    last_logits = _passes(model, ids, mask, use_cache, compile_step, bf16)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        end = S + step  # slots filled so far
        with autocast, draws(step):
            logits = last_logits(end)
        nxt = _next_tokens(logits, temperature, top_k, generators)
        # A finished row keeps receiving masked pads, which no real query ever sees.
        ids[:, end] = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        mask[:, end] = ~done
        if eod_id is not None:
            done = done | (nxt == eod_id)
            if (step + 1) % DONE_CHECK_EVERY == 0 and bool(done.all()):  # the only host read
                break
    return _continuations(ids[:, S:], mask[:, S:], eod_id)  # slots never filled are masked


def _passes(
    model: TransformerLM,
    ids: torch.Tensor,
    mask: torch.Tensor,
    use_cache: bool,
    compile_step: bool,
    cache_dtype: torch.dtype | None,
) -> Callable[[int], torch.Tensor]:
    """The pass that predicts slot ``end`` of ``ids`` (and ``mask``) from the slots before it, as
    the last position's logits ``[B, V]``: the KV cache's (in ``cache_dtype``; None: the
    model's) while they fit in the context, else a recomputation of the last ``context_length``."""
    C = model.config.context_length
    # Positions drawn at evaluation are drawn afresh for the whole sequence at every pass; a
    # cache would hold the keys of one draw and read the new token at its plain position.
    use_cache = use_cache and not model.config.random_positions_eval
    step_model = model
    if compile_step and use_cache:
        step_model = compile_model(model, ids.device, fullgraph=True, setting="--compile")
    cache: KVCache | None = None

    def last_logits(end: int) -> torch.Tensor:
        nonlocal cache
        if use_cache and end <= C:
            if cache is None:  # the prompt: capacity for every slot up to the context
                cache = model.new_cache(len(ids), min(C, ids.shape[1]), cache_dtype)
                return model(ids[:, :end], key_mask=mask[:, :end], cache=cache)[:, -1]
            new = slice(end - 1, end)  # one new token: fixed shapes, whatever the step
            return step_model(ids[:, new], key_mask=mask[:, new], cache=cache)[:, -1]
        # Beyond the context (or without a cache) the last C slots, recomputed. FlexAttention
        # compiles one kernel per length: it gets one length, the slots not yet filled masked
        # (right padding, which no real query reads).
        width = min(C, ids.shape[1]) if model.config.kernel == "flex" else min(C, end)
        start = max(0, end - width)
        window = slice(start, start + width)
        return model(ids[:, window], key_mask=mask[:, window])[:, end - start - 1]

    return last_logits


def _continuations(ids: torch.Tensor, mask: torch.Tensor, eod_id: int | None) -> list[list[int]]:
    """Each row's new tokens (the real ones of its new slots ``[B, max_new_tokens]``) up to (not
    including) its first ``eod_id``: one host copy for the whole batch."""
    out = []
    for row, real in zip(ids.tolist(), mask.tolist(), strict=True):
        kept = [t for t, r in zip(row, real, strict=True) if r]
        out.append(kept[: kept.index(eod_id)] if eod_id in kept else kept)  # None is no token
    return out
