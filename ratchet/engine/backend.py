"""The backend protocol: what the engine asks of a model runner (NumPy or CUDA). The engine
owns scheduling and the sampling recipe; a backend owns the weights and the KV cache, runs the
model and samples where the logits are, seeing slots, tokens and positions, never a Request."""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import numpy as np

from ratchet.engine.sampling import SamplingBatch
from ratchet.model.config import ModelConfig


class Backend(Protocol):
    """Built as `Backend(cfg, dtype, max_batch_size, max_seq_len)`: weights, KV cache and the
    activations the CUDA kernels store are held in `dtype` ("fp32", "fp16", "bf16"). Slots
    0 .. max_batch_size - 1 each cache one sequence, positions 0 .. max_seq_len - 1."""

    cfg: ModelConfig
    dtype: str
    max_batch_size: int
    max_seq_len: int
    batch_invariant: bool
    """A row's logits are bit for bit independent of its batch and of whether its cache came
    from a prefill or decode steps (NumPy: always; CUDA: when built batch-invariant), so a
    sampled answer scored again gets the bits it was sampled with."""
    weight_device: str
    """Where `update_weights` takes tensors without a host copy: "cpu" or "cuda:N"."""

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Every engine tensor (ratchet.model.layout.expected_shapes), float32 on the dtype's
        grid, copied: later changes to the caller's arrays do not reach the backend."""
        ...

    def update_weights(self, weights: Mapping[str, object]) -> None:
        """Any subset, shapes checked, written in place (a sync allocates nothing): float32
        NumPy arrays on the dtype's grid, or (CUDA) float32 DLPack tensors on weight_device,
        rounded there; a `FlatWeights` (every tensor, one buffer) the CUDA backend takes as one
        range. Every slot is empty afterwards."""
        ...

    def weight_checksums(self) -> dict[str, tuple[int, int]]:
        """Each stored tensor's `ratchet.model.checksum` over its bits as the engine holds them
        (the trainer compares it with its masters rounded: sync/weights_parity)."""
        ...

    def prefill(self, slot: int, token_ids: Sequence[int], start_pos: int = 0) -> np.ndarray:
        """Caches token_ids at start_pos.. of `slot` (positions below must hold this sequence:
        start_pos > 0 appends); float32 logits [V] of the last position only."""
        ...

    def prefill_batch(self, slots: Sequence[int], token_lists: Sequence[Sequence[int]],
                      start_positions: Sequence[int] | None = None) -> np.ndarray:
        """`prefill` of several sequences in distinct slots (a GPU packs them): float32 [n, V]."""
        ...

    def decode(self, slots: Sequence[int], tokens: Sequence[int],
               positions: Sequence[int]) -> np.ndarray:
        """One token a slot (distinct), each at a position <= its slot's cached length (appends,
        or rewrites the tail): caches it, float32 logits [B, V]."""
        ...

    def prefill_sample(self, slots: Sequence[int], token_lists: Sequence[Sequence[int]],
                       batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray]:
        """`prefill_batch` from position 0, then a token a sequence drawn from its last logits:
        (tokens int64 [n], logprobs float32 [n])."""
        ...

    def decode_sample(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
                      batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray]:
        """`decode`, then ratchet.engine.sampler.sample's tokens for its logits (its recipe,
        where the logits are): (tokens int64 [B], logprobs float32 [B]). Forced rows of the
        batch take their token, with the log-probability a drawn one would get."""
        ...

    def decode_sample_async(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
                            batch: SamplingBatch, feed: Sequence[int] | None = None) -> "DecodeStep":
        """`decode_sample` launched, read later (`result()`), so the host stages the next step
        while this one runs; at most two unread. Where feed[b] >= 0, row b's input is the token
        the previous sampling step drew at row feed[b], taken where it lies (tokens[b] ignored)."""
        ...

    def free(self, slot: int) -> None:
        """The slot's cache is empty; its next prefill starts at 0."""
        ...

    def reset(self) -> None:
        """Every slot empty, and any other cached state dropped."""
        ...


class DecodeStep(Protocol):
    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens int64 [B], logprobs float32 [B]) of a launched step; waits for it."""
        ...


class ReadyStep:
    """A step whose result is already on the host (a backend that computes at launch)."""

    def __init__(self, tokens: np.ndarray, logprobs: np.ndarray):
        self._result = (tokens, logprobs)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        return self._result


def feed_rows(feed, tokens, prev_rows: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(feed as int64, or None when no row is fed; tokens as int64 with 0 at fed rows),
    checked against the previous sampling step's row count (0: there is none)."""
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if feed is None:
        return None, tokens
    feed = np.asarray(feed, dtype=np.int64).reshape(-1)
    if len(feed) != len(tokens):
        raise ValueError(f"decode: feed has {len(feed)} rows, tokens {len(tokens)}")
    fed = feed >= 0
    if not fed.any():
        return None, tokens
    if not prev_rows:
        raise ValueError("decode: feed names rows of a previous step, but no sampling step has run "
                         "since the last reset")
    if feed.max() >= prev_rows:
        raise ValueError(f"decode: feed row {int(feed.max())} is past the previous step's {prev_rows} rows")
    return feed, np.where(fed, 0, tokens)


def fed_tokens(feed: np.ndarray, tokens: np.ndarray, prev_tokens: np.ndarray) -> np.ndarray:
    """The rows' input tokens on the host: prev_tokens[feed] where fed, tokens elsewhere."""
    return np.where(feed >= 0, prev_tokens[np.maximum(feed, 0)], tokens)
