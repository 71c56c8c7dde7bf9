"""The backend protocol: what the engine asks of a model runner (NumPy or CUDA).

The engine owns scheduling and the sampling recipe; a backend owns the weights and the KV
cache and runs the model. It never sees a Request, only slots, token ids and positions.

Contract
- Construction: `Backend(cfg, dtype, max_batch_size, max_seq_len)`. `dtype` ("fp32", "fp16",
  "bf16") is the storage dtype of weights and KV cache; activations are stored in it too,
  as the CUDA kernels store them. Slots are 0 .. max_batch_size - 1; a slot holds the KV
  cache of one sequence, positions 0 .. max_seq_len - 1.
- `load_weights(weights)`: every engine tensor (names and shapes of
  `ratchet.model.layout.expected_shapes(cfg)`), float32 arrays on the dtype's grid. The
  backend copies them: later changes to the caller's arrays do not reach it.
- `update_weights(weights)`: any subset of the names, shapes checked, written in place
  (the CUDA backend keeps its buffers, so a weight sync allocates nothing). Takes host
  float32 arrays on the dtype's grid; the CUDA backend also takes float32 DLPack tensors
  (torch CUDA tensors) on `weight_device`, rounded there. Drops every cached state computed
  with the old weights: all slots are empty afterwards.
- `prefill(slot, token_ids, start_pos) -> float32 [V]`: writes k, v of `token_ids` at
  positions start_pos .. start_pos + len - 1 of `slot` (positions below start_pos must hold
  this sequence already: start_pos > 0 appends) and returns the logits of the last
  position, as a NumPy array. The LM head runs on that position only.
- `prefill_batch(slots, token_lists, start_positions=None) -> float32 [n, V]`: `prefill` of
  several sequences (distinct slots, start positions default 0); a GPU backend packs them
  into one pass. The engine prefills through this.
- `decode(slots, tokens, positions) -> float32 [B, V]`: one token per slot (slots distinct),
  token b at position positions[b] (which must be <= that slot's cached length: it appends,
  or rewrites the tail); writes its k, v and returns the logits of every row.
- `prefill_sample(slots, token_lists, batch) -> (tokens int64 [n], logprobs float32 [n])`:
  `prefill_batch` from position 0, then the sampler on each last position's logits, where
  they are. `batch`: a `ratchet.engine.sampling.SamplingBatch`, one row a sequence.
- `decode_sample(slots, tokens, positions, batch) -> (tokens int64 [B], logprobs float32 [B])`:
  `decode`, then `ratchet.engine.sampler.sample` on its logits, bit for bit its tokens. The
  engine decodes through this, so a GPU backend samples where the logits are (copying
  [B, V] logits to the host costs more than the tokens).
- `decode_sample_async(slots, tokens, positions, batch, feed=None) -> DecodeStep`:
  `decode_sample` launched, its result (`step.result()`, the same pair) read later, so that
  the host prepares the next step while the GPU runs this one. `feed` (optional, one int a
  row): where feed[b] >= 0, row b's input token is the token the previous sampling step
  drew at its row feed[b], taken where it lies (on the GPU, without waiting for it), and
  tokens[b] is ignored. At most two launched steps may be unread; a third launch reads the
  oldest first. The engine overlaps its steps through this (`Engine(overlap=True)`).
- A batch's forced rows (`SamplingBatch.forced`) take their given token instead of drawing
  one, its log-probability computed exactly as a drawn token's (teacher forcing:
  ratchet/engine/score.py).
- `batch_invariant`: True when a row's logits are bit for bit independent of the batch it
  runs in and of whether its cache came from a prefill or decode steps. The NumPy backend
  always is; the CUDA backend is when built with `batch_invariant=True` (one decode bucket,
  prompts prefilled by decode steps).
- `weight_device`: "cpu" (the NumPy backend) or "cuda:N" (the GPU the CUDA backend's
  buffers live on): where `update_weights` takes tensors without a host copy.
- `free(slot)`: the slot's cache is empty; the next prefill on it starts at 0.
- `reset()`: every slot empty, and any other cached state (e.g. a prefix cache) dropped.

Reproducibility: the NumPy backend gives a row's logits bit for bit independent of the other
rows, of the slot, and of whether its cache was filled by prefill or by decode steps, which
makes batching and cancel/resume invisible in the output. A GPU backend should at least be
deterministic run to run (its cuBLAS products may let a row's last bits follow the batch),
and batch-invariant on request.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import numpy as np

from ratchet.engine.sampling import SamplingBatch
from ratchet.model.config import ModelConfig

class Backend(Protocol):
    cfg: ModelConfig
    dtype: str
    max_batch_size: int
    max_seq_len: int
    batch_invariant: bool
    weight_device: str  # "cpu" or "cuda:N"

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None: ...

    def update_weights(self, weights: Mapping[str, object]) -> None:
        """NumPy float32 arrays on the dtype grid, or (CUDA) DLPack tensors on weight_device."""
        ...

    def prefill(self, slot: int, token_ids: Sequence[int], start_pos: int = 0) -> np.ndarray: ...

    def prefill_batch(self, slots: Sequence[int], token_lists: Sequence[Sequence[int]],
                      start_positions: Sequence[int] | None = None) -> np.ndarray: ...

    def decode(self, slots: Sequence[int], tokens: Sequence[int],
               positions: Sequence[int]) -> np.ndarray: ...

    def prefill_sample(self, slots: Sequence[int], token_lists: Sequence[Sequence[int]],
                       batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray]: ...

    def decode_sample(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
                      batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray]: ...

    def decode_sample_async(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
                            batch: SamplingBatch, feed: Sequence[int] | None = None) -> "DecodeStep": ...

    def free(self, slot: int) -> None: ...

    def reset(self) -> None: ...


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
