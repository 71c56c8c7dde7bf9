"""dev/ablate_record.py: whichever ablation tables a run wrote become one record, the gradient
table keyed by engine dtype, update count and remedy."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dev.ablate_record import ablate_record
from ratchet import config


def gradient_rows():
    rows = []
    for dtype in ("fp16", "bf16"):
        for updates in (0, 3):
            for variant, cos, rel in (("reference", 1.0, 0.0), ("engine_old", 0.99, 0.1), ("fix", 0.999, 0.02)):
                rows.append({"engine_dtype": dtype, "updates": updates, "variant": variant, "cosine": cos,
                             "rel_diff": rel + updates, "gap_mean": 1e-3 * (updates + 1), "gap_max": 0.1,
                             "num_tokens": 100 + updates, "norm": 1.0, "ref_norm": 1.0, "ratio_max_dev": 0.0,
                             "weight_mean": 1.0})
    return pd.DataFrame(rows)


def test_a_run_with_only_its_gradient_table_gives_the_table_and_the_last_update_headline(tmp_path):
    gradient_rows().to_parquet(tmp_path / "gradient.parquet")
    cfg = config.load(Path("config/config.yaml"), [])
    rec = ablate_record(tmp_path, cfg)
    assert rec["tables"] == ["gradient.parquet"] and "total_max_gap" not in rec
    table = rec["gradient_table"]
    assert set(table) == {"fp16", "bf16"} and set(table["bf16"]) == {"0", "3"}
    at3 = table["bf16"]["3"]
    assert at3["num_tokens"] == 103 and at3["gap_mean"] == 4e-3 and "reference" not in at3
    assert abs(at3["engine_old"]["one_minus_cosine"] - 0.01) < 1e-12 and at3["fix"]["rel_diff"] == 3.02
    assert rec["gradient_updates"] == 3 and rec["gradient_rel_diff_fix"] == 3.02
