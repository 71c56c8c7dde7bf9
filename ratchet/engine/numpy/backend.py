"""The NumPy reference backend: the model in float32 over weights held in the engine dtype,
with activations rounded to it wherever a CUDA kernel stores them (`_store`), so the two
backends differ only in summation order. Slow but exact, and batch-invariant (layers.py)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ratchet.engine.backend import ReadyStep, fed_tokens, feed_rows
from ratchet.engine.numpy.kv_cache import KVCache
from ratchet.engine.numpy.layers import (
    apply_rope,
    attention,
    linear,
    rms_norm,
    silu_mul,
)
from ratchet.engine.sampler import sample
from ratchet.engine.sampling import SamplingBatch
from ratchet.model.checksum import block_checksums
from ratchet.model.config import ModelConfig
from ratchet.model.dtypes import round_to
from ratchet.model.layout import (
    DTYPES,
    check_update,
    check_weights,
    expected_shapes,
    rope_tables,
)

ARRAY_DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": np.float32}  # bf16 values held in float32
PREFILL_CHUNK = 64  # prompt tokens per forward pass: bounds the attention temporaries


class NumpyBackend:
    batch_invariant = True  # always (layers.py): a row's bits never depend on the batch
    weight_device = "cpu"  # update_weights takes NumPy arrays

    def __init__(self, cfg: ModelConfig, dtype: str, max_batch_size: int, max_seq_len: int):
        if dtype not in DTYPES:
            raise ValueError(f"numpy backend: dtype {dtype!r} is not one of {DTYPES}")
        self.cfg, self.dtype = cfg, dtype
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.storage = ARRAY_DTYPES[dtype]
        self.weights: dict[str, np.ndarray] = {}
        self.rope_cos, self.rope_sin = rope_tables(cfg, max_seq_len)  # [S, hd/2]
        self.reset()  # the KV cache

    # ---------------------------------------------------------------- weights

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        check_weights(self.cfg, weights, "numpy backend load_weights")
        self.weights = {name: self._to_storage(weights[name]) for name in expected_shapes(self.cfg)}
        self.reset()

    def update_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        check_update(self.cfg, weights, "numpy backend update_weights")
        for name, value in weights.items():
            self.weights[name][...] = self._to_storage(value)
        self.reset()

    def weight_checksums(self) -> dict[str, tuple[int, int]]:
        return dict(zip(self.weights, block_checksums([self._stored_words(w) for w in self.weights.values()], np)))

    def _stored_words(self, w: np.ndarray) -> np.ndarray:
        """The tensor's bits as the CUDA backend stores them, as int16 words (bf16 values are
        held in float32 here: their high halves are the bf16 bits)."""
        if self.dtype == "bf16":
            return (np.ascontiguousarray(w).reshape(-1).view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
        return np.ascontiguousarray(w).reshape(-1).view(np.int16)

    def _to_storage(self, value: np.ndarray) -> np.ndarray:
        return np.array(round_to(value, self.dtype), dtype=self.storage)  # always a copy

    def _store(self, x: np.ndarray) -> np.ndarray:
        return round_to(x, self.dtype)

    # ---------------------------------------------------------------- cache

    def free(self, slot: int) -> None:
        self.cache.clear(slot)

    def reset(self) -> None:
        self.cache = KVCache(self.cfg, self.storage, self.max_batch_size, self.max_seq_len)
        self._last_tokens: np.ndarray | None = None  # the last sampling step's tokens (feed)

    # ---------------------------------------------------------------- forward

    def prefill(self, slot: int, token_ids: Sequence[int], start_pos: int = 0) -> np.ndarray:
        tokens = np.asarray(token_ids, dtype=np.int64)
        cached = int(self.cache.lengths[slot])
        assert tokens.ndim == 1 and len(tokens) > 0, "prefill needs at least one token"
        assert 0 <= start_pos <= cached, f"prefill of slot {slot} at {start_pos}: {cached} cached"
        assert start_pos + len(tokens) <= self.max_seq_len, "prefill runs past max_seq_len"
        for begin in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[begin:begin + PREFILL_CHUNK]
            positions = start_pos + begin + np.arange(len(chunk))
            hidden = self._forward(chunk, slot, positions)  # [T, D]
        self.cache.lengths[slot] = start_pos + len(tokens)
        return self._logits(hidden[-1:])[0]

    def prefill_batch(self, slots: Sequence[int], token_lists: Sequence[Sequence[int]],
                      start_positions: Sequence[int] | None = None) -> np.ndarray:
        """Each slot's prompt, in turn. A prompt from position 0 that an earlier slot of the call
        prefilled (a GRPO group's answers share theirs) is computed once and its cache rows
        copied: a row's arithmetic does not depend on its slot, so the bits are the same."""
        starts = [0] * len(slots) if start_positions is None else start_positions
        assert len(set(slots)) == len(slots), "prefill slots must be distinct"
        rows, done = [], {}  # prompt -> (the slot that holds it, its last logits)
        for slot, ids, start in zip(slots, token_lists, starts):
            key = tuple(int(t) for t in ids) if start == 0 else None
            if key in done:
                source, logits = done[key]
                self.cache.copy(source, slot, len(key))
            else:
                logits = self.prefill(slot, ids, start)
                if key is not None:
                    done[key] = (slot, logits)
            rows.append(logits)
        return np.stack(rows)

    def prefill_sample(self, slots, token_lists, batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray]:
        return sample(self.prefill_batch(slots, token_lists), batch)

    def decode_sample(self, slots, tokens, positions, batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray]:
        return self.decode_sample_async(slots, tokens, positions, batch).result()

    def decode_sample_async(self, slots, tokens, positions, batch: SamplingBatch, feed=None) -> ReadyStep:
        """Computed at once (the CPU has nothing to overlap); `feed` as the protocol says."""
        prev = self._last_tokens
        feed, tokens = feed_rows(feed, tokens, 0 if prev is None else len(prev))
        if feed is not None:
            tokens = fed_tokens(feed, tokens, prev)
        out = sample(self.decode(slots, tokens, positions), batch)
        self._last_tokens = out[0]
        return ReadyStep(*out)

    def decode(self, slots: Sequence[int], tokens: Sequence[int],
               positions: Sequence[int]) -> np.ndarray:
        slots = np.asarray(slots, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        assert len(np.unique(slots)) == len(slots), "decode slots must be distinct"
        assert np.all(positions <= self.cache.lengths[slots]), "decode position past the cache"
        assert np.all(positions < self.max_seq_len), "decode position past max_seq_len"
        hidden = self._forward(np.asarray(tokens, dtype=np.int64), slots, positions)  # [B, D]
        self.cache.lengths[slots] = positions + 1
        return self._logits(hidden)

    def _forward(self, tokens: np.ndarray, slots, positions: np.ndarray) -> np.ndarray:
        """Hidden states [R, D] of rows at `positions` of `slots`; writes their k, v."""
        x = self._store(self.weights["embed.weight"][tokens])
        num_keys = int(positions.max()) + 1
        for layer in range(self.cfg.num_layers):
            x = self._attention_block(layer, x, slots, positions, num_keys)
            x = self._mlp_block(layer, x)
        return x

    def _attention_block(self, layer: int, x, slots, positions, num_keys: int) -> np.ndarray:
        cfg, w, p = self.cfg, self.weights, f"layers.{layer}."
        rows, hd = len(x), cfg.head_dim
        h = self._store(rms_norm(x, w[p + "attn_norm.weight"], cfg.rms_norm_eps))
        qkv = self._store(linear(h, w[p + "wqkv.weight"], w.get(p + "wqkv.bias")))
        q, k, v = np.split(qkv, [cfg.num_heads * hd, (cfg.num_heads + cfg.num_kv_heads) * hd], -1)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # [R, hd/2]
        q = self._store(apply_rope(q.reshape(rows, cfg.num_heads, hd), cos, sin))
        k = self._store(apply_rope(k.reshape(rows, cfg.num_kv_heads, hd), cos, sin))
        self.cache.write(layer, slots, positions, k, v.reshape(rows, cfg.num_kv_heads, hd))
        keys, values = self.cache.read(layer, slots, num_keys)
        attn = self._store(attention(q, keys, values, positions)).reshape(rows, -1)
        return self._store(x + self._store(linear(attn, w[p + "wo.weight"])))

    def _mlp_block(self, layer: int, x: np.ndarray) -> np.ndarray:
        cfg, w, p = self.cfg, self.weights, f"layers.{layer}."
        h = self._store(rms_norm(x, w[p + "mlp_norm.weight"], cfg.rms_norm_eps))
        gate, up = np.split(self._store(linear(h, w[p + "w_gate_up.weight"])), 2, axis=-1)
        act = self._store(silu_mul(gate, up))
        return self._store(x + self._store(linear(act, w[p + "w_down.weight"])))

    def _logits(self, x: np.ndarray) -> np.ndarray:
        """float32 [R, V] for the rows whose next token is wanted (the LM head's only input)."""
        h = self._store(rms_norm(x, self.weights["norm.weight"], self.cfg.rms_norm_eps))
        head = self.weights.get("lm_head.weight", self.weights["embed.weight"])
        return linear(h, head)
