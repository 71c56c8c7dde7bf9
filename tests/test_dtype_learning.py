"""dev/dtype_learning.py: each compute dtype's run against the fp32 run on the same problems."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dev.dtype_learning import gather


def write_run(folder, correct, rewards):
    folder.mkdir()
    n = len(correct)
    steps = pd.DataFrame({"step": range(len(rewards)), "train/reward": rewards, "time/step_s": 1.0,
                          "mismatch/logprob_abs_diff_mean": 1e-3})
    final_eval = pd.DataFrame({"step": [len(rewards)], "eval/accuracy": [float(np.mean(correct))]})  # as train writes it
    pd.concat([steps, final_eval], ignore_index=True).to_parquet(folder / "metrics.parquet")
    acc = float(np.mean(correct))
    (folder / "after_split.json").write_text(json.dumps({"accuracy": acc, "n": n,
                                                         "accuracy_stderr": (acc * (1 - acc) / n) ** 0.5}))
    pd.DataFrame({"id": np.arange(n)[::-1], "reward": np.asarray(correct, float)[::-1]}).to_parquet(
        folder / "after_split_answers.parquet")


def test_the_paired_difference_is_over_the_same_problems(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.random(400) < 0.3
    same = base.copy()
    better = base | (rng.random(400) < 0.2)  # only gains
    write_run(tmp_path / "fp32", base, np.linspace(0.1, 0.3, 20))
    write_run(tmp_path / "bf16", same, np.linspace(0.1, 0.3, 20))
    write_run(tmp_path / "fp16", better, np.linspace(0.1, 0.4, 20))
    rec = gather({"fp32": tmp_path / "fp32", "bf16": tmp_path / "bf16", "fp16": tmp_path / "fp16"})
    assert rec["runs"]["bf16"]["paired_diff_vs_fp32"]["diff"] == 0 and rec["within_noise"]["bf16"]
    d = rec["runs"]["fp16"]["paired_diff_vs_fp32"]
    assert d["diff"] == pytest.approx(better.mean() - base.mean()) and d["worse"] == 0
    assert not rec["within_noise"]["fp16"]  # dozens of problems gained, none lost
    assert rec["runs"]["fp16"]["reward_last_tenth"] == pytest.approx(0.4 - 0.3 / 19 / 2, rel=1e-6)
    assert rec["runs"]["fp16"]["steps"] == 20  # the final eval's row is not a training step
    assert rec["runs"]["fp16"]["median time/step_s"] == 1.0  # the eval row's missing timings skipped


def test_a_difference_is_established_only_after_holm(tmp_path):
    """Two dtypes each 2 points ahead on 1,000 problems (p ~0.035 each): not established
    once corrected for the two comparisons, though each alone is under 0.05."""
    rng = np.random.default_rng(1)
    base = rng.random(1000) < 0.3
    moved = base.copy()
    moved[np.flatnonzero(base)[:35]], moved[np.flatnonzero(~base)[:55]] = False, True  # +20 of 90 moved
    for name, correct in (("fp32", base), ("bf16", moved), ("fp16", moved)):
        write_run(tmp_path / name, correct, np.linspace(0.1, 0.3, 20))
    rec = gather({"fp32": tmp_path / "fp32", "bf16": tmp_path / "bf16", "fp16": tmp_path / "fp16"})
    d = rec["runs"]["fp16"]["paired_diff_vs_fp32"]
    assert d["p"] < 0.05 < d["p_holm"] and not d["established"]
    assert rec["within_noise"] == {"bf16": True, "fp16": True}


def test_runs_on_other_problems_are_refused(tmp_path):
    write_run(tmp_path / "fp32", [1, 0, 1], [0.1, 0.2])
    write_run(tmp_path / "fp16", [1, 0], [0.1, 0.2])
    with pytest.raises(SystemExit, match="other problems"):
        gather({"fp32": tmp_path / "fp32", "fp16": tmp_path / "fp16"})


def test_any_run_can_be_the_reference(tmp_path):
    """Another knob of the split training (extra_groups) compares the same way: against the run
    named as the reference, with no fp32 run among them."""
    rng = np.random.default_rng(2)
    base = rng.random(300) < 0.3
    fewer = base & (rng.random(300) < 0.8)  # only losses
    write_run(tmp_path / "extra4", base, np.linspace(0.1, 0.3, 20))
    write_run(tmp_path / "extra8", fewer, np.linspace(0.1, 0.3, 20))
    rec = gather({"extra4": tmp_path / "extra4", "extra8": tmp_path / "extra8"}, reference="extra4")
    d = rec["runs"]["extra8"]["paired_diff_vs_extra4"]
    assert rec["reference"] == "extra4" and d["diff"] == pytest.approx(fewer.mean() - base.mean())
    assert d["better"] == 0 and "paired_diff_vs_extra4" not in rec["runs"]["extra4"]
    with pytest.raises(SystemExit, match="--run fp32=DIR"):
        gather({"extra4": tmp_path / "extra4"})  # the default reference is fp32
