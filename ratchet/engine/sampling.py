"""The rows of one sampling step: what the engine hands a backend beside the model's inputs,
built once per step and checked where it is built, so every sampler (NumPy, CUDA) takes and
refuses the same batches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingBatch:
    """One row per sequence. A row draws with the noise keyed by (seed, request id) at counter
    token index (ratchet/engine/rng.py), or takes its forced token, with its log-probability
    computed as a drawn one's (teacher forcing)."""

    seeds: np.ndarray  # int64 [B]; the RNG uses it modulo 2**32
    request_ids: np.ndarray  # int64 [B]
    token_indices: np.ndarray  # int64 [B]: the token's index in its answer (resumed: the same stream)
    temperatures: np.ndarray  # float32 [B]
    greedy: np.ndarray  # bool [B]
    forced: np.ndarray | None = None  # int64 [B], -1 where the row draws; None when no row is forced

    def __post_init__(self):
        temperatures = np.asarray(self.temperatures, dtype=np.float32).reshape(-1)
        n = len(temperatures)
        greedy = np.asarray(self.greedy, dtype=bool).reshape(n)
        positive = temperatures > 0  # False for NaN too
        if not positive.all() and not (positive | greedy).all():  # the common case costs one test
            raise ValueError("sampling: temperature must be > 0 for non-greedy rows")
        set_field = object.__setattr__  # frozen: the fields are normalised once, here
        set_field(self, "temperatures", temperatures)
        set_field(self, "greedy", greedy)
        for name in ("seeds", "request_ids", "token_indices"):
            set_field(self, name, np.asarray(getattr(self, name), dtype=np.int64).reshape(n))
        if self.forced is not None:
            forced = np.asarray(self.forced, dtype=np.int64).reshape(n)
            if (forced < -1).any():
                raise ValueError(f"sampling: forced token {int(forced[forced < -1][0])} is below -1 (-1: draw)")
            set_field(self, "forced", forced if (forced >= 0).any() else None)

    def __len__(self) -> int:
        return len(self.temperatures)

    def check(self, num_rows: int, vocab_size: int) -> None:
        """The batch fits logits [num_rows, vocab_size]: one row each, forced tokens in the
        vocabulary."""
        if len(self) != num_rows:
            raise ValueError(f"sampling: the batch has {len(self)} rows for {num_rows} rows of logits")
        if self.forced is not None and (self.forced >= vocab_size).any():
            bad = self.forced[self.forced >= vocab_size][0]
            raise ValueError(f"sampling: forced token {int(bad)} is outside [-1, {vocab_size})")
