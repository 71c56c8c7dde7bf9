"""Source weights snapped onto a coarser grid before conversion: the released-bf16 condition.

A checkpoint released in bf16 holds values on the bf16 grid, so the first sync of a bf16
engine rounds nothing away; weights dequantised from a GGUF file lie off that grid, and how
many of the first updates an engine sees changes with it. `convert.snap_to: bf16` puts any
source on the released condition: every weight rounded to nearest even on the grid, as fp32.
"""

from __future__ import annotations

import numpy as np

from ratchet.errors import InputError
from ratchet.model.dtypes import round_to

SNAP_GRIDS = ("bf16", "fp16")


def snap_weights(weights: dict[str, np.ndarray], grid: str | None) -> dict[str, np.ndarray]:
    """`weights` with every value rounded onto `grid` (None: `weights` itself, untouched)."""
    if grid is None:
        return weights
    if grid not in SNAP_GRIDS:
        raise InputError(f"config: key 'convert.snap_to' must be null or one of "
                         f"{', '.join(SNAP_GRIDS)}; got {grid!r}")
    return {name: round_to(w, grid) for name, w in weights.items()}


def changed_by_storage(weights: dict[str, np.ndarray], dtype: str) -> int:
    """How many values storing in `dtype` changes. bf16-grid values in fp16 change only outside
    fp16's normal range: below 2**-17 they lose bits to its subnormal step 2**-24 (and stay on
    the bf16 grid, that step being coarser), above 65504 they overflow."""
    changed = 0
    for w in weights.values():
        w = np.asarray(w, dtype=np.float32)
        changed += int(np.count_nonzero((round_to(w, dtype) != w) & ~np.isnan(w)))
    return changed
