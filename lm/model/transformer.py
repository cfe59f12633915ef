"""The decoder-only language model: embeddings, position, pre-norm blocks, LM head.

Reads top to bottom next to the notes: token embedding ``E[w_l]`` (plus ``p_l`` for the additive
schemes), ``n_layer`` blocks of causal multi-head self-attention and a token-wise MLP, each on a
residual path, a final norm, and a head that scores every vocabulary entry (tied to ``E``).

The block is GPT-2's by default (LayerNorm, a GELU MLP); ``model.norm: rmsnorm`` and
``model.mlp: swiglu`` make it Llama's (Touvron et al. 2023), ``model.mlp: relu2`` nanochat's,
``model.mlp: none`` attention-only (Elhage et al. 2021; Olsson et al. 2022).

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

from lm.config.errors import LMError
from lm.config.names import Place
from lm.config.sections import ModelConfig
from lm.model.attention import MultiHeadAttention
from lm.model.cache import KVCache
from lm.model.masks import Mask, Positions, masks, positions
from lm.model.rmsnorm import RMSNorm
from lm.model.schemes import SCHEME_CLASSES


class MLP(nn.Module):
    """The token-wise feed-forward network: ``W_2 GELU(W_1 x)``, or with ``model.mlp: relu2``
    ``W_2 ReLU(W_1 x)^2`` (So et al. 2021, "Primer", sec. 4; nanochat's MLP)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.up = nn.Linear(config.d_model, config.ff_dim, bias=config.bias)
        self.down = nn.Linear(config.ff_dim, config.d_model, bias=config.bias)
        # Exact (erf) GELU: GPT-2's tanh approximation is slower on CPUs (scripts/bench.py).
        self.activation = squared_relu if config.mlp == "relu2" else F.gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(x)))


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    """``ReLU(x)^2``."""
    return F.relu(x).square()


class SwiGLU(nn.Module):
    """Llama's MLP (Shazeer 2020, "GLU Variants Improve Transformer", eq. 6):
    ``W_2 (SiLU(W_1 x) * W_3 x)``, a gate times a value, elementwise. Three matrices of hidden
    width ``ff_dim`` (by default 2/3 of 4d: the GELU MLP's parameter count)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(config.d_model, config.ff_dim, bias=config.bias)  # W_1
        self.up = nn.Linear(config.d_model, config.ff_dim, bias=config.bias)  # W_3
        self.down = nn.Linear(config.ff_dim, config.d_model, bias=config.bias)  # W_2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LayerNorm(nn.LayerNorm):
    """Each position's features brought to mean 0 and variance 1, then scaled (and shifted).

    On CPU the two steps are two ops: PyTorch's fused kernel sums the scale's gradient over the
    positions in one part per thread, so a run's weights would depend on how many threads it
    had. Summed by autograd, the gradient is the same on any number of threads (so are the
    runs of ``lm compare --jobs N`` and one at a time, tests/test_jobs.py). A GPU has no thread
    count to depend on and keeps the one fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return super().forward(x)
        y = F.layer_norm(x, self.normalized_shape, eps=self.eps) * self.weight
        return y if self.bias is None else y + self.bias


def block_norm(config: ModelConfig) -> nn.Module:
    """The block's norm of the residual stream: LayerNorm, or RMSNorm (which has no bias)."""
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, eps=config.norm_eps)
    return LayerNorm(config.d_model, eps=config.norm_eps, bias=config.bias)


class Block(nn.Module):
    """Pre-norm block: ``x + Attn(LN(x))``, then (unless ``model.mlp: none``) ``x + MLP(LN(x))``."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.norm1 = block_norm(config)
        self.attn = MultiHeadAttention(config, layer)
        only = config.mlp == "none"  # attention-only (Elhage et al. 2021): no MLP, no 2nd norm
        self.norm2 = None if only else block_norm(config)
        self.mlp = None if only else (SwiGLU if config.mlp == "swiglu" else MLP)(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, where: Positions, mask: Mask, cache=None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x), where, mask, cache))
        return x if self.mlp is None else x + self.drop(self.mlp(self.norm2(x)))


def unbuildable(config: object) -> str:
    """Why ``TransformerLM(config)`` cannot build a model, in one line."""
    if not isinstance(config, ModelConfig):
        kind = type(config).__name__
        return f"config: a {kind} is not a ModelConfig: give lm.load_config(PATH).model"
    return "config: its vocab_size is not set (it comes from the tokenizer)"


class TransformerLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig) or config.vocab_size is None:
            raise LMError(unbuildable(config))
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)  # E
        scheme = SCHEME_CLASSES[config.layer_positions[0]]  # one for every layer if on E[w]
        self.pos_embed = scheme(config) if scheme.place is Place.EMBEDDINGS else None  # p_l
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(map(Block, [config] * config.n_layer, range(config.n_layer)))
        self.norm = block_norm(config)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        for module in self.modules():  # GPT-2's initialisation, in the order apply() visits
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # GPT-2: residual branches' output projections scaled so the stream's variance stays O(1)
        std = 0.02 / math.sqrt(config.n_layer * (1 if config.mlp == "none" else 2))  # branches
        for block in self.blocks:
            for proj in (block.attn.out, block.mlp.down) if block.mlp else (block.attn.out,):
                nn.init.normal_(proj.weight, mean=0.0, std=std)
        # Of each scheme whose layers read one bias (ALiBi, T5), the first layer's, which makes it
        self.one_bias_schemes = []  # (a list: not submodules again)
        for block in self.blocks:
            scheme = block.attn.position
            if scheme.one_bias and type(scheme) not in map(type, self.one_bias_schemes):
                self.one_bias_schemes.append(scheme)

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Distinct parameters (a tied head counts once); optionally without the embeddings."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.embed.weight.numel()
            n -= (
                sum(p.numel() for p in self.pos_embed.parameters())
                if self.pos_embed is not None
                else 0
            )
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
        self, input_ids: torch.Tensor, key_mask=None, segment_ids=None, cache=None, kernel=None
    ) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` for ``input_ids [B, T]``: ``key_mask [B, T]`` (True = real
        token) for padded batches; ``segment_ids [B, T]`` for packed windows of several documents
        (attention stays inside each and positions restart); ``cache`` to decode after earlier
        calls; ``kernel`` in place of ``model.kernel``."""
        c, training = self.config, self.training
        if cache is not None:  # the new tokens take the cache's next slots
            cache.extend(
                torch.ones_like(input_ids, dtype=torch.bool) if key_mask is None else key_mask
            )
        where = positions(c, input_ids, key_mask, segment_ids, cache, training)  # read once
        M = masks(c, where, key_mask, segment_ids, cache, training=training, kernel=kernel)
        for scheme in self.one_bias_schemes:  # the bias B its layers read, made before they do
            where.biases[type(scheme)] = scheme.bias(where, M[c.layer_windows[0]])
        x = self.embed(input_ids)  # E[w_l]: (B, T, d)
        if self.pos_embed is not None:
            x = self.pos_embed.embed(x, where)  # E[w_l] + p_l
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, where, M[block.attn.window], cache)  # (B, T, d)
        return self.head(self.norm(x))  # (B, T, vocab)

    def new_cache(self, batch: int, capacity: int, dtype: torch.dtype | None = None) -> KVCache:
        """An empty KV cache of ``capacity`` slots for ``batch`` sequences, on this model's
        device, keys and values in ``dtype`` (default: the weights')."""
        weight = self.embed.weight
        return KVCache(self.config, batch, capacity, weight.device, dtype or weight.dtype)

    @torch.no_grad()
    def attention_weights(
        self,
        input_ids: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's normalization input ``S + B + M`` and attention matrix ``A`` (the
        notes' ``softmax_row(S + M)``, or the model's ``model.normalize``), ``[B, H, T, T]``
        each, as a forward pass through the explicit formula computes them: ``(scores,
        weights)`` per layer; the masks as ``forward`` takes them."""
        layers = []

        def keep(attn, args, y):  # the layer once more, returning its weights as well
            layers.append(attn.forward(*args, weights=True)[1])

        hooks = [block.attn.register_forward_hook(keep) for block in self.blocks]
        try:
            self(input_ids, key_mask, segment_ids, kernel="math")
        finally:
            for hook in hooks:
                hook.remove()
        return layers


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
