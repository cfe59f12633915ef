"""The decoder-only language model: embeddings, position, pre-norm blocks, LM head.

Reads top to bottom next to the notes: token embedding ``E[w_l]`` (plus ``p_l`` for the additive
schemes), ``n_layer`` blocks of causal multi-head self-attention and a token-wise MLP, each on a
residual path, a final norm, and a head that scores every vocabulary entry (tied to ``E``).

Padding: a batch may mix sequences of different lengths, padded on either side. ``key_mask``
marks the real tokens; padded keys never supply values to real queries and positions count real
tokens only, so every real token's logits equal those of its sequence run alone.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lm.attention import LayerKVCache, MultiHeadAttention
from lm.config import LMError, ModelConfig
from lm.position import (
    Rope,
    RopeCache,
    positions_from_mask,
    positions_from_segments,
    sinusoidal_table,
)


class PositionOutOfRange(LMError):
    """A learned position table has no row for this position."""


class MLP(nn.Module):
    """The token-wise feed-forward network: ``W_2 GELU(W_1 x)``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.up = nn.Linear(config.d_model, config.ff_dim, bias=config.bias)
        self.down = nn.Linear(config.ff_dim, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Exact (erf) GELU: GPT-2's tanh approximation is slower on CPUs (scripts/bench.py).
        return self.down(F.gelu(self.up(x)))


def rope_of(config: ModelConfig) -> Rope | None:
    """RoPE's angles as the config sets them (None for the other schemes)."""
    if config.position != "rope":
        return None
    pairs = None if config.rope_fraction == 1.0 else config.rope_pairs
    return Rope(
        config.head_dim,
        config.rope_base,
        pairs,
        config.rope_method,
        config.rope_factor,
        config.rope_context,
    )


class Block(nn.Module):
    """Pre-norm transformer block: ``x + Attn(LN(x))``, then ``x + MLP(LN(x))``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)
        self.attn = MultiHeadAttention(
            config.d_model,
            config.n_head,
            position=config.position,
            rope=rope_of(config),
            kernel=config.attention,
            dropout=config.dropout,
            bias=config.bias,
        )
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, **attn_args) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, weights = self.attn(self.norm1(x), causal=True, **attn_args)
        x = x + self.drop(a)
        x = x + self.drop(self.mlp(self.norm2(x)))
        return x, weights


class KVCache:
    """Every layer's keys and values, plus what all layers share: which slots hold real tokens
    and at which positions. Slots are filled left to right, ``capacity`` at most; attention reads
    every slot through ``key_mask`` (False at pads and unfilled slots), so a one-token step has
    fixed shapes. ``dtype`` stores keys and values in another precision (bf16 under autocast).

    Only ``extend`` (and each layer's ``append``) changes the cache.
    """

    def __init__(
        self, model: TransformerLM, batch: int, capacity: int, dtype: torch.dtype | None = None
    ):
        like = next(model.parameters())
        cfg = model.config
        self.layers = [
            LayerKVCache(batch, cfg.n_head, capacity, cfg.head_dim, like, dtype)
            for _ in model.blocks
        ]
        self.length = 0  # slots filled (host bookkeeping)
        self.key_mask = torch.zeros(batch, capacity, dtype=torch.bool, device=like.device)
        self.key_positions = torch.zeros(batch, capacity, dtype=torch.long, device=like.device)
        self._real = torch.zeros(batch, dtype=torch.long, device=like.device)  # real tokens so far
        self._slot = torch.arange(capacity, device=like.device)
        self._next = torch.zeros((), dtype=torch.long, device=like.device)  # first free slot

    def extend(self, new_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Record T new slots (``new_mask [B, T]``, True = real). Returns their positions
        ``[B, T]``, each row counting on from its own real tokens, and the key mask and key
        positions of the filled slots, ``[B, length]`` each (views of ``key_mask`` and
        ``key_positions``, which cover every slot)."""
        T = new_mask.shape[1]
        end = self.length + T
        if end > self.key_mask.shape[1]:
            raise ValueError(f"KV cache holds {self.key_mask.shape[1]} slots; {end} requested")
        positions = positions_from_mask(new_mask, self._real)
        slots = self._next + self._slot[:T]  # (T,): written at a device-side index
        self.key_mask.index_copy_(1, slots, new_mask)
        self.key_positions.index_copy_(1, slots, positions)
        self._real += new_mask.sum(dim=1)
        self._next += T
        self.length = end
        return positions, self.key_mask[:, :end], self.key_positions[:, :end]


class TransformerLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("ModelConfig.vocab_size must be set (it comes from the tokenizer)")
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d)  # E
        if config.position == "learned":
            self.pos_embed = nn.Embedding(config.context_length, d)
        if config.position == "sinusoidal":
            table = sinusoidal_table(config.context_length, d)
            self.register_buffer("sinusoids", table, persistent=False)
            self.embed_scale = math.sqrt(d)
        if config.position == "rope":  # cos and sin of every trained position, computed once
            self.rope = RopeCache(rope_of(config), config.context_length)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.LayerNorm(d, eps=config.norm_eps, bias=config.bias)
        self.head = nn.Linear(d, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        self.apply(self._init_weights)
        # GPT-2: residual-path output projections scaled so the stream's variance stays O(1)
        # whatever the depth.
        for block in self.blocks:
            for proj in (block.attn.out, block.mlp.down):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Distinct parameters (a tied head counts once); optionally without the embeddings."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.embed.weight.numel()
            if self.config.position == "learned":
                n -= self.pos_embed.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward and backward), as nanoGPT and PaLM count them:
        ``6 N + 12 L d T``.

        N is every weight a token is multiplied by: the blocks, the final norm and the head's
        ``vocab x d`` matrix, which is a full matmul whether or not it is tied to the embedding.
        The token and position tables are lookups, not matmuls, and are left out. ``12 L d T``
        is attention's two ``T``-long products per layer (``Q K^T`` and ``A V``).
        """
        c = self.config
        n = self.num_parameters(non_embedding=True)
        if c.tie_embeddings:  # non_embedding dropped the shared matrix together with E
            n += self.head.weight.numel()
        return 6 * n + 12 * c.n_layer * c.d_model * seq_len

    def forward(
        self,
        input_ids: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` for ``input_ids [B, T]``.

        ``key_mask [B, T]`` (True = real token) for padded batches; ``segment_ids [B, T]`` for
        packed windows holding several documents (attention stays inside each document and
        positions restart at each); ``cache`` to decode incrementally after earlier calls.
        """
        logits, _ = self._run(input_ids, key_mask, segment_ids, cache, need_weights=False)
        return logits

    def attention_maps(
        self, input_ids: torch.Tensor, key_mask: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """The attention matrices A of every layer, each ``[B, H, T, T]`` (the explicit path)."""
        _, maps = self._run(input_ids, key_mask, None, None, need_weights=True)
        return maps

    def _run(
        self,
        input_ids: torch.Tensor,
        key_mask: torch.Tensor | None,
        segment_ids: torch.Tensor | None,
        cache: KVCache | None,
        need_weights: bool,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        T = input_ids.shape[1]
        past = cache.length if cache is not None else 0
        # Where each token sits: real tokens counted from 0 (padding and documents respected).
        key_positions = None  # the keys' positions are the queries', unless a cache holds more
        if cache is not None:
            if key_mask is None:
                key_mask = torch.ones_like(input_ids, dtype=torch.bool)
            positions = cache.extend(key_mask)[0]
            key_mask, key_positions = cache.key_mask, cache.key_positions  # (B, capacity)
        elif segment_ids is not None:
            positions = positions_from_segments(segment_ids)
        elif key_mask is not None:
            positions = positions_from_mask(key_mask)
        else:
            positions = torch.arange(T, device=input_ids.device)

        x = self._embed(input_ids, positions, past + T)  # (B, T, d)
        attn = {"positions": positions, "key_mask": key_mask, "key_positions": key_positions}
        attn["shared"] = {}  # masks and ALiBi bias: built by the first layer, reused by the rest
        if segment_ids is not None:  # attention stays inside each document
            attn["segments"] = segment_ids
        if self.config.position == "rope":  # cos and sin looked up once, for every layer
            attn["rope_angles"] = self.rope(positions, past + T)
        layer_caches = cache.layers if cache is not None else [None] * len(self.blocks)
        maps = []
        for block, layer_cache in zip(self.blocks, layer_caches, strict=True):
            x, weights = block(x, cache=layer_cache, need_weights=need_weights, **attn)
            maps.append(weights)
        return self.head(self.norm(x)), maps

    def _embed(self, input_ids: torch.Tensor, positions: torch.Tensor, top: int) -> torch.Tensor:
        """``x_l = E[w_l] + p_l`` (``p_l`` for the additive schemes only), ``[B, T, d]``.

        ``top`` bounds the positions from above (slots so far) without reading the tensor, which
        would stall a GPU.
        """
        x = self.embed(input_ids)
        if self.config.position == "learned":
            if top > self.config.context_length:
                raise PositionOutOfRange(
                    f"learned positions cover 0..{self.config.context_length - 1}; position "
                    f"{top - 1} has no trained vector (use a shorter context)"
                )
            x = x + self.pos_embed(positions)
        elif self.config.position == "sinusoidal":
            table = self.sinusoids
            if top > table.shape[0]:  # fixed sinusoids extend to any length
                table = sinusoidal_table(top, self.config.d_model, device=table.device)
            # The fixed sinusoids have entries of size ~1; scaling the embedding by sqrt(d) (as
            # Vaswani et al. do) keeps a token's identity from drowning in its position. The
            # notes' E is this scaled table.
            x = x * self.embed_scale + table[positions].to(self.embed.weight.dtype)
        return self.drop(x)


# Logits above this many elements are scored in chunks of rows, so that no fp32 copy of the whole
# [B*T, V] logits (and, in training, no saved fp32 log-softmax) exists at once: GPT-2 small at
# 32 x 1024 tokens would otherwise hold two 6.6 GB fp32 tensors beside its bf16 logits.
LOSS_CHUNK_ELEMENTS = 1 << 26


def loss_sum(
    logits: torch.Tensor,
    targets: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    chunk_elements: int = LOSS_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Summed next-token cross-entropy over real targets (the notes' loss mask).

    The caller divides by the number of real targets in the whole batch, so micro-batches and
    processes holding different numbers of real tokens still add up to one big batch's mean.
    Logits of more than ``chunk_elements`` are scored a chunk of rows at a time, each upcast on
    its own and, under autograd, recomputed in the backward pass instead of kept; the sum is the
    same up to float rounding (small logits take the one-call path, bit for bit as before).
    """
    if loss_mask is not None:
        targets = targets.masked_fill(~loss_mask, -100)  # ignored by cross_entropy
    flat, flat_targets = logits.flatten(0, 1), targets.flatten()  # [B*T, V], [B*T]
    if flat.numel() <= chunk_elements:
        return _cross_entropy_sum(flat, flat_targets)
    rows = max(1, chunk_elements // flat.shape[1])
    recompute = torch.is_grad_enabled() and flat.requires_grad
    total = None
    for part, part_targets in zip(flat.split(rows), flat_targets.split(rows), strict=True):
        if recompute:
            loss = checkpoint(_cross_entropy_sum, part, part_targets, use_reentrant=False)
        else:
            loss = _cross_entropy_sum(part, part_targets)
        total = loss if total is None else total + loss
    return total


def _cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``logits`` [N, V] upcast to fp32, ``targets`` [N] (-100: no loss): the summed loss."""
    return F.cross_entropy(logits.float(), targets, ignore_index=-100, reduction="sum")
