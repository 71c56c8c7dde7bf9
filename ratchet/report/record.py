"""Each training mode's paired gain over the baseline, read from a run folder: the report's
(the gatherer of committed records, which also uses it, lives in dev/record.py)."""

from __future__ import annotations

import pandas as pd

from ratchet.paths import RunPaths
from ratchet.report.tables import TRAIN_MODES, paired_gain


def paired_gains(paths: RunPaths) -> dict[str, dict]:
    """Mode -> the paired gain of its after-training eval over the baseline, where both evals'
    per-problem answers exist."""
    before = paths.eval_answers("baseline")
    out = {}
    for mode in TRAIN_MODES:
        after = paths.eval_answers(f"after_{mode}")
        if before.is_file() and after.is_file():
            out[mode] = paired_gain(pd.read_parquet(before), pd.read_parquet(after))
    return out
