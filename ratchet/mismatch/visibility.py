"""Which updates the engine can see: an fp32 master that moves less than half a unit in the
last place of the engine dtype rounds back to the value the engine already holds.

    changed_share(before, after, "fp16")   # share of weights whose fp16 value changed
    off_grid_share(masters, "bf16")        # share of fp32 masters not on the bf16 grid
    frame = visibility(setup, settings)    # both, per update, for each engine dtype

With lr 1e-6 and fp16 spacing 1.5e-5 near 0.02, most of an AdamW step rounds away at the
sync; the masters drift off the grid while the engine holds still, until a weight crosses
half a spacing and its engine value jumps by a whole one.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from ratchet.mismatch.fix import AblateSettings, Setup, Trajectory
from ratchet.model.dtypes import round_to


def _count(weights: Mapping[str, np.ndarray], test) -> tuple[int, int]:
    hits = total = 0
    for name, w in weights.items():
        hits += int(np.count_nonzero(test(name, np.asarray(w, dtype=np.float32))))
        total += int(np.size(w))
    return hits, total


def changed_share(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray],
                  dtype: str) -> float:
    """Share of weights whose value in `dtype` differs between the two sets of fp32 masters."""
    hits, total = _count(after, lambda name, w: round_to(w, dtype) != round_to(before[name], dtype))
    return hits / total if total else 0.0


def moved_share(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray]) -> float:
    """Share of fp32 masters that changed at all."""
    hits, total = _count(after, lambda name, w: w != np.asarray(before[name], dtype=np.float32))
    return hits / total if total else 0.0


def off_grid_share(weights: Mapping[str, np.ndarray], dtype: str) -> float:
    """Share of fp32 values that `dtype` cannot hold exactly (rounding changes them)."""
    hits, total = _count(weights, lambda name, w: round_to(w, dtype) != w)
    return hits / total if total else 0.0


def visibility(setup: Setup, settings: AblateSettings, log=None) -> pd.DataFrame:
    """One row per (update, dtype), update 0 being the converted weights: the share of
    masters the update moved, the share whose `dtype` value it changed, and the share of
    masters off the `dtype` grid after it. `log(update, rows)` after each update."""
    traj = Trajectory(setup, settings.grpo("none"))
    dtypes = settings.engine_dtypes
    before = traj.masters()
    rows = [{"update": 0, "steps": 0, "dtype": d, "moved_share": 0.0, "changed_share": 0.0,
             "off_grid_share": off_grid_share(before, d)} for d in dtypes]
    if log is not None:
        log(0, rows)
    for update in range(1, settings.visibility_updates + 1):
        traj.advance_to(update, settings.max_steps_per_update)
        after = traj.masters()
        moved = moved_share(before, after)
        found = [{"update": update, "steps": traj.step, "dtype": d, "moved_share": moved,
                  "changed_share": changed_share(before, after, d),
                  "off_grid_share": off_grid_share(after, d)} for d in dtypes]
        rows += found
        if log is not None:
            log(update, found)
        before = after
    return pd.DataFrame(rows)
