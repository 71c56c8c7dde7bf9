"""The visibility counts (ratchet/mismatch/visibility.py) against NumPy's own count."""

from __future__ import annotations

import numpy as np
import torch

from ratchet.mismatch.visibility import changed_share, moved_share, off_grid_share


def weights(seed: int, step: float = 0.0) -> dict:
    rng = np.random.default_rng(seed)
    base = {"a": rng.standard_normal((7, 5)).astype(np.float32), "b": rng.standard_normal(13).astype(np.float32)}
    return {k: v + np.float32(step) * np.float32(rng.standard_normal(v.shape)) for k, v in base.items()}


def test_shares_count_every_tensor_as_numpy_does():
    before = weights(0)
    after = weights(0, step=1e-3)
    after["b"][:4] = before["b"][:4]  # some masters stay put
    cat = lambda d: np.concatenate([v.ravel() for v in d.values()])  # noqa: E731
    b, a = cat(before), cat(after)
    assert moved_share(before, after) == np.count_nonzero(a != b) / a.size
    for dtype, np_dtype in (("fp16", np.float16),):
        assert changed_share(before, after, dtype) == np.count_nonzero(a.astype(np_dtype) != b.astype(np_dtype)) / a.size
        assert off_grid_share(after, dtype) == np.count_nonzero(a.astype(np_dtype).astype(np.float32) != a) / a.size
    as_torch = {k: torch.from_numpy(v) for k, v in after.items()}  # torch tensors count the same
    assert moved_share(before, as_torch) == moved_share(before, after)
    assert moved_share({}, {}) == 0.0
