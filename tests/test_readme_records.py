"""The README's figures that come from a committed record agree with it: a rerun that changes
the record fails here until the README says what it now shows."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
REMEDIES = {"no remedy": "none", "TIS (cap 2)": "tis", "MIS ([0.5, 2])": "mis",
            "the fix (rounded weights)": "fix", "the exact fix": "exact"}
ROW = re.compile(r"^\| (?P<label>[^|]+?) \| (?P<dtype>fp16|bf16) \| (?P<rest>.*)\|$")


def _learning_rows() -> dict[tuple[str, str], str]:
    """The README's learning table: (dtype, remedy) -> the rest of its row."""
    text = (ROOT / "README.md").read_text()
    start = text.index("| 100 steps | engine | step 0 |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        m = ROW.match(line)
        if not m:
            break
        rows[(m["dtype"], REMEDIES[m["label"]])] = m["rest"]
    return rows


def test_the_readmes_learning_table_is_the_records():
    record = ROOT / "results/records/h200-learning/learning.parquet"
    if not record.is_file():
        pytest.skip("no learning record")
    runs = pd.read_parquet(record)
    rows = _learning_rows()
    assert set(rows) == {(d, r) for d in ("fp16", "bf16") for r in REMEDIES.values()}
    for r in runs.itertuples():
        cells = [c.strip() for c in rows[(r.dtype, r.remedy)].split("|")]
        gap = "0 (every token, every step)" if r.gap_mean_mean_over_steps == 0 else f"{r.gap_mean_mean_over_steps:.1e}".replace("e-0", "e-")
        assert cells[:4] == [f"{100 * r.baseline_accuracy:.1f}%",
                             f"{100 * r.accuracy:.1f}% ± {100 * r.accuracy_stderr:.1f}",
                             f"{100 * r.gain:+.1f} ± {100 * r.gain_stderr:.1f} pts", gap], (r.dtype, r.remedy)
    for key in set(rows) - {(r.dtype, r.remedy) for r in runs.itertuples()}:  # a run the record lacks
        assert "not run yet" in rows[key], key
