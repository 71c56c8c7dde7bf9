"""dev/grpo_step.py, the GRPO step bench: its variant grammar, and a run on the tiny profile
whose record holds each variant's step medians."""

from __future__ import annotations

import json

import pytest

from dev import grpo_step


def test_variants_parse_and_bad_ones_name_the_option():
    assert grpo_step.parse_variant("split:fp16") == {"name": "split:fp16", "mode": "split",
                                                      "compute_dtype": "fp16", "fix": "none"}
    assert grpo_step.parse_variant("colocated:bf16:exact")["fix"] == "exact"
    for bad in ("split", "split:fp8", "colocated:fp32:tis", "other:fp32"):
        with pytest.raises(SystemExit, match="--variants"):
            grpo_step.parse_variant(bad)


@pytest.mark.slow
def test_bench_records_each_variants_medians(tmp_path):
    out = tmp_path / "step.json"
    grpo_step.main(["--config", "config/config.yaml", "--set", f"results_dir={tmp_path / 'results'}",
                    "--steps", "3", "--variants", "colocated:fp32,split:fp32:fix", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["complete"] and [v["name"] for v in record["variants"]] == ["colocated:fp32", "split:fp32:fix"]
    for v in record["variants"]:
        assert v["median"]["time/step_s"] > 0 and len(v["per_step_s"]) == 3


def test_a_switch_interval_must_be_positive():
    with pytest.raises(SystemExit, match="switch-interval-ms: must be > 0"):
        grpo_step.main(["--steps", "3", "--switch-interval-ms", "0", "--out", "x.json"])


def test_the_exact_fix_overhead_pairs_each_exact_variant_with_its_fix_per_step_and_per_token():
    record = {"variants": [
        {"name": "colocated:fp32:fix", "median": {"time/step_s": 2.0, "train/num_tokens": 1000.0}},
        {"name": "colocated:fp32:exact", "median": {"time/step_s": 2.2, "train/num_tokens": 800.0}},
        {"name": "split:fp16:exact", "median": {"time/step_s": 1.0, "train/num_tokens": 10.0}},  # no fix twin
        {"name": "split:fp16", "error": "exit status 1"}]}
    got = grpo_step.exact_fix_overhead(record)
    assert set(got) == {"colocated:fp32:exact"}
    assert abs(got["colocated:fp32:exact"]["raw_median"] - 0.1) < 1e-12
    assert abs(got["colocated:fp32:exact"]["per_token"] - (2.2 / 800 / (2.0 / 1000) - 1)) < 1e-12


def test_a_step_without_trained_tokens_leaves_the_gap_medians_defined():
    """A step whose groups all scored alike logs no gap (NaN); the medians skip and count it."""
    import numpy as np
    import pandas as pd

    gap = "mismatch/logprob_abs_diff_mean"
    rows = pd.DataFrame({"step": range(6), "time/step_s": [9.0, 9.0, 1.0, 2.0, 3.0, 4.0],
                         gap: [1.0, 1.0, 0.1, np.nan, 0.3, 0.2]})
    got = grpo_step.step_medians(rows, steps=6)
    assert got["median"]["time/step_s"] == 2.5 and got["median"][gap] == 0.2
    assert got["steps_without_gap"] == 1
