"""The KV cache for incremental decoding: every layer's keys and values, and which slots hold
real tokens at which positions.

Slots are filled left to right, ``capacity`` at most, and preallocated: attention reads every
slot (the unfilled ones masked) and new keys are written at a device-side slot index, so a
one-token step has the same shapes and no host-side slicing at every step, and can be compiled
or captured as a CUDA graph. Keys are stored after RoPE, each keeping the rotation of its own
position, at the width the layer's scheme leaves them (PoPE's are twice a head's width). With
grouped-query attention (``model.n_kv_head``) the cache holds the ``n_kv_head`` key/value heads,
not one per query head: ``n_head / n_kv_head`` times fewer bytes. With smeared keys
(``model.smear_keys``) it also keeps each row's last real key before smearing, for the next
token to mix with (:meth:`KVCache.with_last_key`).
"""

from __future__ import annotations

import torch

from lm.config.sections import ModelConfig
from lm.model.masks import positions_from_mask


class KVCache:
    """Keys and values ``[B, H_kv, capacity, width]`` per layer, the key mask and key positions
    ``[B, capacity]`` (False and 0 at pads and unfilled slots). ``dtype`` stores keys and values
    in another precision (bf16 under autocast). Only ``extend`` moves the slots: the model
    calls it once per forward pass, before the layers read and write this pass's slots."""

    def __init__(
        self,
        config: ModelConfig,
        batch: int,
        capacity: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        shape = (config.n_layer, batch, config.kv_heads, capacity, config.head_dim)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # A layer's keys are made at its first store, at the width its scheme gives them.
        self.k: list[torch.Tensor | None] = [None] * config.n_layer
        self.key_mask = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.key_positions = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.start = 0  # the current pass's first slot (host bookkeeping)
        self.length = 0  # slots filled
        self.positions = self.key_positions[:, :0]  # the current pass's tokens' positions
        self._real = torch.zeros(batch, dtype=torch.long, device=device)  # real tokens so far
        self._slot = torch.arange(capacity, device=device)
        self._next = torch.zeros((), dtype=torch.long, device=device)  # first free slot
        self._new = self._slot[:0]  # the slots of the current pass
        self._sums: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # see cumulative
        self._kept: dict[tuple[int, str], torch.Tensor] = {}  # see keep
        self._last: dict[int, torch.Tensor] = {}  # see with_last_key

    def extend(self, new_mask: torch.Tensor) -> torch.Tensor:
        """Give T new tokens (``new_mask [B, T]``, True = real) the next T slots; their
        positions ``[B, T]``, each row counting on from its own real tokens, are returned and
        kept as ``positions``."""
        T = new_mask.shape[1]
        end = self.length + T
        if end > self.key_mask.shape[1]:
            raise ValueError(f"KV cache holds {self.key_mask.shape[1]} slots; {end} requested")
        positions = positions_from_mask(new_mask, self._real)
        self._new = self._next + self._slot[:T]  # (T,): written at a device-side index
        self.key_mask.index_copy_(1, self._new, new_mask)
        self.key_positions.index_copy_(1, self._new, positions)
        self._real += new_mask.sum(dim=1)
        self._next += T
        self.start, self.length, self.positions = self.length, end, positions
        return positions

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Write one layer's new keys and values ``[B, H_kv, T, d_k]`` into this pass's slots;
        return that layer's keys and values of every slot, ``[B, H_kv, capacity, d_k]``. Keys
        are kept as the scheme leaves them: a scheme with a parameter per query head (PoPE's
        phase offsets, FoPE's coefficients) gives each query head its own keys."""
        if self.k[layer] is None:  # a scheme may give keys their own heads and width (PoPE's)
            B, _, capacity, _ = self.v.shape[1:]
            self.k[layer] = self.v.new_zeros(B, k.shape[1], capacity, k.shape[-1])
        self.k[layer].index_copy_(2, self._new, k.to(self.v.dtype))
        self.v[layer].index_copy_(2, self._new, v.to(self.v.dtype))
        return self.k[layer], self.v[layer]

    @property
    def nbytes(self) -> int:
        """The bytes of every layer's keys and values (the keys of a layer once it has stored)."""
        return self.v.nbytes + sum(k.nbytes for k in self.k if k is not None)

    def cumulative(self, layer: int, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Running sums of a per-token value of one layer (FoX's log forget gates), ``values [B,
        H, T]`` for this pass's tokens: their sums ``[B, H, T]``, each row counting on from its
        earlier tokens, and every slot's ``[B, H, capacity]``. The sums live here beside the keys,
        made at the first pass and updated in place after."""
        if layer not in self._sums:
            B, H, capacity = values.shape[0], values.shape[1], self.key_mask.shape[1]
            slots = values.new_zeros(B, H, capacity)
            self._sums[layer] = (slots, values.new_zeros(B, H))
        slots, total = self._sums[layer]
        sums = total[..., None] + values.cumsum(dim=-1)
        slots.index_copy_(2, self._new, sums)
        total.copy_(sums[..., -1])
        return sums, slots

    def keep(self, layer: int, name: str, values: torch.Tensor) -> torch.Tensor:
        """Keep a per-token value of one layer beside its keys (PaTH's transforms): ``values [B,
        H, T, ...]`` of this pass's tokens go into their slots; every slot's, ``[B, H, capacity,
        ...]`` (zeros where no token was kept), is returned. Made at the first pass."""
        if (layer, name) not in self._kept:
            shape = (*values.shape[:2], self.key_mask.shape[1], *values.shape[3:])
            self._kept[(layer, name)] = values.new_zeros(shape)
        slots = self._kept[(layer, name)]
        slots.index_copy_(2, self._new, values)
        return slots

    def with_last_key(self, layer: int, k: torch.Tensor) -> torch.Tensor:
        """Smeared keys' memory of one layer: ``k [B, H_kv, T, d_k]``, this pass's keys before
        smearing, after each row's last real key of the earlier passes (zeros before any):
        ``[B, H_kv, 1 + T, d_k]``. Each row's last real key of this pass is kept for the next;
        only that one key per row and head, not every slot's."""
        if layer not in self._last:
            self._last[layer] = self.v.new_zeros(*k.shape[:2], 1, k.shape[-1])
        kept = self._last[layer]
        keys = torch.cat([kept.to(k.dtype), k], dim=2)
        real = self.key_mask.index_select(1, self._new)  # (B, T): this pass's real tokens
        last = (real * torch.arange(1, real.shape[1] + 1, device=real.device)).amax(dim=1)
        kept.copy_(keys.gather(2, last.view(-1, 1, 1, 1).expand_as(kept)))  # 0: the kept one
        return keys
