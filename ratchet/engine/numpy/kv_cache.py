"""The KV cache: every slot in one array [slots, layers, 2, kv_heads, seq, head_dim] in the
engine dtype (bf16 as float32 values), so a decode step gathers its rows with one index;
np.zeros pages are backed only once written, so capacity costs what is used."""

from __future__ import annotations

import numpy as np

from ratchet.engine.numpy.layers import KEY_BLOCK
from ratchet.model.config import ModelConfig


class KVCache:
    def __init__(self, cfg: ModelConfig, storage: np.dtype, num_slots: int, max_seq_len: int):
        self.max_seq_len = max_seq_len
        capacity = -(-max_seq_len // KEY_BLOCK) * KEY_BLOCK  # whole key blocks
        self.data = np.zeros((num_slots, cfg.num_layers, 2, cfg.num_kv_heads, capacity,
                              cfg.head_dim), dtype=storage)
        self.lengths = np.zeros(num_slots, dtype=np.int64)  # cached positions per slot

    def write(self, layer: int, slots, positions: np.ndarray, k: np.ndarray, v: np.ndarray):
        """k, v [R, K, hd] at positions [R] of slots (an int, or [R] distinct slots)."""
        self.data[slots, layer, 0, :, positions] = k
        self.data[slots, layer, 1, :, positions] = v

    def clear(self, slot: int) -> None:
        """Empty the slot, zeroing what it held: attention multiplies the (masked) stale values
        beyond a sequence's position by 0, and an inf left by an earlier sequence would make NaN."""
        self.data[slot, :, :, :, : self.lengths[slot]] = 0
        self.lengths[slot] = 0

    def copy(self, source: int, slot: int, length: int) -> None:
        """Give `slot` the first `length` cached positions of `source`, as a prefill of the same
        prompt from position 0 would write them (what lies beyond is left, as a prefill leaves it)."""
        assert length <= self.lengths[source], f"slot {source} holds {self.lengths[source]} positions, not {length}"
        self.data[slot, :, :, :, :length] = self.data[source, :, :, :, :length]
        self.lengths[slot] = length

    def read(self, layer: int, slots, num_keys: int) -> tuple[np.ndarray, np.ndarray]:
        """keys, values [R or 1, K, n, hd], n = num_keys rounded up to whole key blocks."""
        n = -(-num_keys // KEY_BLOCK) * KEY_BLOCK
        kv = self.data[slots, layer, :, :, :n]  # [2, K, n, hd] for one slot, else [R, 2, ...]
        if kv.ndim == 4:
            kv = kv[None]
        return kv[:, 0], kv[:, 1]
