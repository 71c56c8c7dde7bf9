"""dev.grid_conditions: two runs' ablate_decompose tables in one record, the seed study's
figures beside them labelled as quoted."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dev.grid_conditions import SEED_REFERENCE, compare
from ratchet.paths import RunPaths


def fake_run(results, name, bf16_changed, snap_to=None):
    """A run folder holding the two tables (and a manifest when the source was snapped)."""
    paths = RunPaths(results, name)
    paths.decompose_table.parent.mkdir(parents=True)
    vis = [{"update": u, "steps": u, "dtype": d, "moved_share": 0.9, "off_grid_share": 0.0 if u == 0 else 0.99,
            "changed_share": 0.0 if u == 0 else (bf16_changed / u if d == "bf16" else 0.03)}
           for u in range(31) for d in ("fp16", "bf16")]
    pd.DataFrame(vis).to_parquet(paths.visibility_table)
    gaps = [{"updates": u, "steps": u, "engine_dtype": d, "source": s, "reference": "", "against": "",
             "abs_diff_mean": 1e-3 * (u + 1), "abs_diff_p99": 0.0, "abs_diff_max": 1e-2 * (u + 1),
             "ratio_outside_share": 0.0, "kl_k3": 0.0, "num_tokens": 100}
            for u in (0, 1, 3) for d in ("fp16", "bf16") for s in ("weight_rounding", "total", "exact")]
    pd.DataFrame(gaps).to_parquet(paths.decompose_table)
    if snap_to:
        paths.model.mkdir(parents=True)
        paths.manifest.write_text(json.dumps({"dtype": "fp16", "snap_to": snap_to, "snap_changed_by_storage": 4}))
    return paths.root


def test_both_conditions_side_by_side_with_the_quoted_figures(tmp_path):
    record = compare([fake_run(tmp_path, "local", 0.09), fake_run(tmp_path, "local-bf16grid", 0.02, "bf16")])
    default, snapped = record["conditions"]["local"], record["conditions"]["local-bf16grid"]
    assert default["snap_to"] is None and snapped["snap_to"] == "bf16" and snapped["snap_changed_by_storage"] == 4
    assert snapped["visibility"]["bf16"]["changed_share"] == pytest.approx(
        {"1": 0.02, "3": 0.02 / 3, "10": 0.002, "30": 0.02 / 30})
    assert default["visibility"]["bf16"]["off_grid_share"]["0"] == 0.0
    gaps = default["decomposition"]["fp16"]
    assert set(gaps) == {"weight_rounding", "total"}  # only the sources the record quotes
    assert gaps["total"]["3"] == pytest.approx({"max": 0.04, "mean": 0.004})
    assert record["seed_reference"] is SEED_REFERENCE and "not measured" in SEED_REFERENCE["label"]


def test_a_run_without_its_tables_is_named(tmp_path):
    with pytest.raises(SystemExit, match="decompose.parquet"):
        compare([tmp_path / "nothing-here"])
