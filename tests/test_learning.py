"""ablate_learning: the paired statistics and Holm's correction on inputs whose answers are known,
one learning run on a tiny model (its rows, its evals, evals that do not perturb training), the
aggregate stage on constructed runs, clear errors for bad settings, and (slow) the rules on the
tiny profile."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from configured import ablate_settings

from ratchet.config import ConfigError, validate
from ratchet.mismatch.learning import (
    LearningSettings,
    difference_table,
    learning_run,
    record,
    run_table,
)
from ratchet.mismatch.paired import holm, paired_difference

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- paired statistics
def test_paired_difference_matches_a_hand_computation():
    a = np.array([1, 0, 0, 1, 0, 1, 0, 0])
    b = np.array([1, 1, 0, 1, 1, 0, 1, 0])
    d = b - a  # [0, 1, 0, 0, 1, -1, 1, 0]: mean 2/8
    sd = math.sqrt(sum((x - 0.25) ** 2 for x in d) / 7)
    out = paired_difference(a, b)
    assert out["diff"] == pytest.approx(0.25)
    assert out["stderr"] == pytest.approx(sd / math.sqrt(8))
    assert out["z"] == pytest.approx(0.25 / (sd / math.sqrt(8)))
    assert out["ci_low"] == pytest.approx(0.25 - 1.959964 * sd / math.sqrt(8), rel=1e-6)
    assert out["p"] == pytest.approx(math.erfc(abs(out["z"]) / math.sqrt(2)))
    assert (out["n"], out["better"], out["worse"]) == (8, 3, 1)


def test_paired_is_tighter_than_independent_when_problems_differ_in_difficulty():
    rng = np.random.default_rng(0)
    easy = rng.random(1000) < 0.5  # half the problems easy: both runs solve those
    a = easy | (rng.random(1000) < 0.05)
    b = easy | (rng.random(1000) < 0.10)
    out = paired_difference(a, b)
    independent = math.sqrt(a.mean() * (1 - a.mean()) / 1000 + b.mean() * (1 - b.mean()) / 1000)
    assert out["stderr"] < 0.7 * independent


def test_identical_runs_differ_by_zero_and_nothing_is_established():
    answers = _answers({"none": [1, 0, 1, 1, 0] * 20, "fix": [1, 0, 1, 1, 0] * 20})
    diffs = difference_table(answers)
    assert len(diffs) == 1
    row = diffs.iloc[0]
    assert (row["diff"], row["stderr"], row["z"], row["p"]) == (0.0, 0.0, 0.0, 1.0)
    assert not row["established"]


def test_a_planted_large_difference_is_established_and_a_small_one_is_not():
    rng = np.random.default_rng(1)
    base = (rng.random(400) < 0.3).astype(int)
    big = base.copy()
    big[np.flatnonzero(base == 0)[:80]] = 1  # +20 points, never worse
    small = base.copy()
    small[np.flatnonzero(base == 0)[:2]] = 1  # +0.5 points
    diffs = difference_table(_answers({"none": base, "fix": big, "tis": small})).set_index(["a", "b"])
    assert diffs.loc[("none", "fix"), "diff"] == pytest.approx(0.2)
    assert diffs.loc[("none", "fix"), "established"]
    assert diffs.loc[("none", "tis"), "diff"] == pytest.approx(0.005)
    assert not diffs.loc[("none", "tis"), "established"]
    assert diffs.loc[("fix", "tis"), "diff"] == pytest.approx(-0.195)
    assert diffs.loc[("fix", "tis"), "established"]


def test_holm_adjusts_step_down_and_keeps_order():
    p = [0.01, 0.04, 0.03, 0.005]
    adjusted, rejected = holm(p)
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4*0.005, 3*0.01, 2*0.03, max(0.06, 1*0.04)
    assert adjusted.tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert rejected.tolist() == [True, False, False, True]
    # Bonferroni would reject only p <= 0.0125; Holm at least as many, here the same two
    assert holm([0.02, 0.02])[1].tolist() == [True, True]  # 2*0.02, then max(0.04, 0.02)
    adjusted, rejected = holm([0.03, 0.04])
    assert adjusted.tolist() == pytest.approx([0.06, 0.06]) and not rejected.any()


def test_holm_ignores_nan_and_is_never_above_one():
    adjusted, rejected = holm([np.nan, 0.5, 0.9])
    assert math.isnan(adjusted[0]) and not rejected[0]
    assert adjusted[1:].tolist() == pytest.approx([1.0, 1.0])


def test_the_run_table_pairs_the_gain_with_the_runs_own_start():
    before = [0] * 50 + [1] * 50
    after = [1] * 10 + [0] * 40 + [1] * 50  # +10 points, all improved
    answers = pd.concat([_answers({"none": before}, step=0), _answers({"none": after}, step=20)])
    steps = pd.DataFrame({"dtype": "bf16", "remedy": "none", "step": range(20),
                          "reward": np.r_[np.zeros(10), np.ones(10)], "gap_mean": np.r_[np.zeros(10), np.ones(10)] / 100})
    runs = run_table(steps, answers)
    r = runs.iloc[0]
    assert (r["baseline_accuracy"], r["accuracy"], r["gain"]) == pytest.approx((0.5, 0.6, 0.1))
    assert r["gain_stderr"] == pytest.approx(np.std([1] * 10 + [0] * 90, ddof=1) / 10)
    assert (r["improved"], r["worsened"], r["n"], r["steps"]) == (10, 0, 100, 20)
    assert (r["reward_first_tenth"], r["reward_last_tenth"]) == (0.0, 1.0)
    assert r["gap_mean_mean_over_steps"] == pytest.approx(0.005) and np.isnan(r["visible_share_mean_over_steps"])
    assert r["gain_established"]
    rec = record(runs, difference_table(answers), LearningSettings(20, 10, ("bf16",), ("none",)))
    assert rec["learning_accuracy_bf16_none"] == pytest.approx(0.6)
    assert rec["learning_established"] == [] and rec["learning_not_established"] == []


def test_pooling_over_dtypes_averages_each_problems_difference_and_skips_a_remedy_run_once():
    from ratchet.mismatch.learning import pooled_difference_table

    rng = np.random.default_rng(1)
    none = {d: rng.random(400) < 0.3 for d in ("fp16", "bf16")}
    fix = {d: none[d] | (rng.random(400) < 0.05) for d in ("fp16", "bf16")}
    answers = pd.concat([_answers({"none": none[d], "fix": fix[d]}, dtype=d) for d in ("fp16", "bf16")]
                        + [_answers({"exact": none["fp16"]}, dtype="fp16")], ignore_index=True)
    pooled = pooled_difference_table(answers)
    assert pooled[["dtypes", "a", "b"]].values.tolist() == [["fp16+bf16", "none", "fix"]]  # exact: fp16 only
    per_problem = ((fix["fp16"].astype(float) - none["fp16"]) + (fix["bf16"].astype(float) - none["bf16"])) / 2
    row = pooled.iloc[0]
    assert row["diff"] == pytest.approx(per_problem.mean())
    assert row["stderr"] == pytest.approx(per_problem.std(ddof=1) / np.sqrt(400))
    rec = record(run_table(pd.DataFrame({"dtype": [], "remedy": [], "step": [], "reward": []}), answers.iloc[:0]),
                 difference_table(answers), LearningSettings(20, 10, ("fp16", "bf16"), ("none", "fix")), pooled)
    assert rec["learning_pooled_over_dtypes_exploratory"][0].startswith("fp16+bf16: fix - none = +")
    assert pooled_difference_table(answers[answers["dtype"] == "fp16"]).empty  # one dtype: nothing to pool


def _answers(runs: dict[str, list], step: int = 20, dtype: str = "bf16") -> pd.DataFrame:
    return pd.concat([pd.DataFrame({"dtype": dtype, "remedy": name, "step": step, "id": range(len(c)),
                                    "correct": np.asarray(c, dtype=bool)}) for name, c in runs.items()],
                     ignore_index=True)


# ---------------------------------------------------------------------------- settings
@pytest.mark.parametrize("bad, culprit", [
    ({"runs": ["none", "sgd"]}, "ablate.learning.runs"),
    ({"runs": ["none", "none"]}, "ablate.learning.runs"),
    ({"engine_dtypes": ["fp8"]}, "ablate.learning.engine_dtypes"),
    ({"eval_every": 0}, "ablate.learning.eval_every"),
    ({"steps": 0}, "ablate.learning.steps"),
    ({"eval_problems": 0}, "ablate.learning.eval_problems"),
    ({"every": 5}, "every"),
])
def test_bad_settings_fail_naming_the_key(bad, culprit):
    with pytest.raises(ConfigError, match=culprit):
        validate({"ablate": {"learning": bad}})
    if culprit != "every":  # and the same settings built directly
        with pytest.raises(ValueError, match=culprit):
            LearningSettings(**{**validate({})["ablate"]["learning"], **bad})


def test_eval_steps_are_the_start_every_n_and_the_end():
    assert LearningSettings(100, 25, ("fp16",), ("none",)).eval_steps() == [0, 25, 50, 75, 100]
    assert LearningSettings(20, 8, ("fp16",), ("none",)).eval_steps() == [0, 8, 16, 20]
    assert LearningSettings(5, 10, ("fp16",), ("none",)).eval_steps() == [0, 5]


def test_the_local_profile_is_the_study():
    import yaml

    cfg = validate(yaml.safe_load((ROOT / "config" / "local.yaml").read_text()))
    learning = LearningSettings.from_config(cfg)
    assert (learning.steps, learning.eval_every, learning.eval_problems) == (100, 25, None)
    assert len(learning.jobs()) == 10 and {j["remedy"] for j in learning.jobs()} == {"none", "tis", "mis", "fix", "exact"}


# ---------------------------------------------------------------------------- one run, tiny model
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A seeded tiny Qwen2 model converted to fp16, the synthetic task and 30 test problems."""
    import torch
    from tiny_setup import tiny_setup

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_setup(tmp_path_factory.mktemp("tiny"), num_test=30, num_measure=4, with_eval=True, init_std=0.1)
    torch.set_num_threads(threads)


SETTINGS = dict(max_new_tokens=2, problems_per_step=4, group_size=4, lr=1e-3, seed=0,
                engine_dtype="fp16", micro_batch_size=16)


def test_a_run_has_its_rows_and_scores_every_problem_at_each_eval_step(tiny):
    learning = LearningSettings(steps=5, eval_every=2, engine_dtypes=("bf16",), runs=("tis",))
    evals = []
    steps, answers = learning_run(tiny, ablate_settings(**SETTINGS), learning, "bf16", "tis",
                                  log_eval=lambda s, a: evals.append((s, a)))
    assert steps["step"].tolist() == list(range(5))
    for col in ("reward", "updates", "gap_mean", "gap_max", "kl_k3", "is_weight_mean",
                "visible_share", "masters_off_grid_share", "weights_parity"):
        assert col in steps and steps[col].notna().any(), col
    assert set(steps["dtype"]) == {"bf16"} and set(steps["remedy"]) == {"tis"}
    assert steps["updates"].iloc[-1] > 0  # it trained
    assert answers.groupby("step")["id"].apply(sorted).to_dict() == {s: list(range(30)) for s in (0, 2, 4, 5)}
    assert [s for s, _ in evals] == [0, 2, 4, 5]
    assert evals[-1][1] == pytest.approx(answers.loc[answers["step"] == 5, "correct"].mean())


def test_evals_do_not_change_the_training_and_runs_repeat_bit_for_bit(tiny):
    s = ablate_settings(**SETTINGS)
    often = LearningSettings(steps=4, eval_every=1, engine_dtypes=("fp16",), runs=("none",))
    rarely = LearningSettings(steps=4, eval_every=4, engine_dtypes=("fp16",), runs=("none",))
    a_steps, a_answers = learning_run(tiny, s, often, "fp16", "none")
    b_steps, b_answers = learning_run(tiny, s, rarely, "fp16", "none")
    pd.testing.assert_frame_equal(a_steps, b_steps)
    final = lambda df: df[df["step"] == 4].reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(final(a_answers), final(b_answers))


def test_evals_on_their_own_engine_see_the_trajectorys_weights_and_score_the_same(tiny, monkeypatch):
    """On CUDA the evals run on a separate fast engine synced before each eval; here a second
    NumPy engine stands in for it: at every eval it holds the trajectory engine's weights."""
    import ratchet.rl.evaluate as evaluate_module

    real, seen = evaluate_module.evaluate, []

    def spy(engine, *args, **kwargs):
        seen.append(sorted(engine.weight_checksums().items()))
        return real(engine, *args, **kwargs)

    monkeypatch.setattr(evaluate_module, "evaluate", spy)
    s = ablate_settings(**SETTINGS)
    learning = LearningSettings(steps=3, eval_every=1, engine_dtypes=("fp16",), runs=("none",))
    assert tiny.eval_engine("fp16") is None  # NumPy: the trajectory's own engine
    a_steps, a_answers = learning_run(tiny, s, learning, "fp16", "none")
    on_trajectory, seen[:] = list(seen), []
    monkeypatch.setattr(type(tiny), "eval_engine", lambda self, dtype, masters=None: self.engine(dtype))
    b_steps, b_answers = learning_run(tiny, s, learning, "fp16", "none")
    assert seen == on_trajectory and len({str(c) for c in seen}) > 1  # synced, and the weights moved
    pd.testing.assert_frame_equal(a_steps, b_steps)
    pd.testing.assert_frame_equal(a_answers, b_answers)


def test_a_cuda_setup_evaluates_on_an_engine_that_is_not_batch_invariant(tiny, monkeypatch):
    import dataclasses

    import ratchet.engines

    made = []
    monkeypatch.setattr(ratchet.engines, "make_engine", lambda model, **kw: made.append(kw) or "engine")
    cuda = dataclasses.replace(tiny, backend="cuda", max_batch_size=48)
    assert cuda.eval_engine("fp16") == "engine"
    assert made[-1]["batch_invariant"] is False and made[-1]["max_batch_size"] == 48
    assert dataclasses.replace(cuda, batch_invariant=False).eval_engine("fp16") is None


def test_every_remedy_is_scored_on_a_cuda_engine_of_one_shape(tiny, monkeypatch):
    """A CUDA engine's greedy answers depend on how many requests share its steps: the exact
    fix's evals (on a second engine) and the other remedies' (on their trajectory's engine)
    must run with the same rows and the same batching, or the comparison measures the engines."""
    import dataclasses

    import ratchet.engines

    made = []
    monkeypatch.setattr(ratchet.engines, "make_engine", lambda model, **kw: made.append(kw) or "engine")
    cuda = dataclasses.replace(tiny, backend="cuda", max_batch_size=48)
    shapes = {}
    for remedy in ("none", "tis", "mis", "fix", "exact"):
        setup = cuda.for_run(ablate_settings(**SETTINGS).grpo(remedy, 2))
        made.clear()
        if setup.eval_engine("fp16") is None:
            setup.engine("fp16")  # evaluated on the trajectory's own engine
        shapes[remedy] = (made[-1]["max_batch_size"], made[-1]["batch_invariant"])
    assert set(shapes.values()) == {(48, False)}, shapes


@pytest.mark.parametrize("remedy, invariant", [("none", False), ("tis", False), ("mis", False), ("fix", False),
                                               ("exact", True)])
def test_only_the_exact_fix_samples_on_a_batch_invariant_engine(tiny, remedy, invariant):
    cfg = ablate_settings(**SETTINGS).grpo(remedy, 2)
    assert tiny.for_run(cfg).batch_invariant is invariant and tiny.batch_invariant


def test_a_run_the_settings_do_not_ask_for_is_refused(tiny):
    learning = LearningSettings(steps=2, eval_every=1, engine_dtypes=("fp16",), runs=("none",))
    with pytest.raises(ValueError, match="bf16-none is not one the config asks for"):
        learning_run(tiny, ablate_settings(**SETTINGS), learning, "bf16", "none")


# ---------------------------------------------------------------------------- the aggregate stage
def test_the_aggregate_stage_writes_its_tables_and_names_a_missing_run(tmp_path, monkeypatch):
    from ratchet.errors import MissingInputError
    from ratchet.paths import RunPaths
    from ratchet.stages.learning import ablate_learning
    from ratchet.tracking import StageRun

    monkeypatch.setenv("RATCHET_TRACKING", "off")
    cfg = validate({"results_dir": str(tmp_path), "ablate": {"learning": {
        "steps": 10, "eval_every": 5, "engine_dtypes": ["fp16"], "runs": ["none", "exact"]}}})
    paths = RunPaths.from_config(cfg)
    rng = np.random.default_rng(0)
    start = rng.random(300) < 0.2
    finals = {"none": start | (rng.random(300) < 0.02), "exact": start | (rng.random(300) < 0.3)}
    with pytest.raises(MissingInputError, match="fp16-none.*--job dtype=fp16 --job remedy=none"):
        ablate_learning(cfg, StageRun("ablate_learning", cfg))
    for remedy, final in finals.items():
        answers = pd.concat([_answers({remedy: start}, step=0, dtype="fp16"),
                             _answers({remedy: final}, step=10, dtype="fp16")], ignore_index=True)
        steps = pd.DataFrame({"dtype": "fp16", "remedy": remedy, "step": range(10), "reward": 0.5})
        paths.learning_run_dir("fp16", remedy).mkdir(parents=True)
        steps.to_parquet(paths.learning_steps("fp16", remedy))
        answers.to_parquet(paths.learning_answers("fp16", remedy))
    ablate_learning(cfg, StageRun("ablate_learning", cfg))
    runs, diffs = pd.read_parquet(paths.learning_table), pd.read_parquet(paths.learning_diffs)
    assert runs["remedy"].tolist() == ["none", "exact"]
    assert runs["accuracy"].tolist() == pytest.approx([finals["none"].mean(), finals["exact"].mean()])
    row = diffs.iloc[0]
    assert (row["a"], row["b"]) == ("none", "exact") and bool(row["established"])
    assert row["diff"] == pytest.approx(finals["exact"].mean() - finals["none"].mean())
    summary = json.loads(paths.learning_summary.read_text())
    assert summary["learning_established"] and summary["learning_established"][0].startswith("fp16: exact - none")
    assert paths.learning_figure.stat().st_size > 0 and paths.learning_curves.is_file()


# ---------------------------------------------------------------------------- the rules, tiny profile
@pytest.mark.slow
def test_snakemake_ablate_learning_on_the_tiny_profile(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "MLFLOW_"))}
    env.update(RATCHET_TRACKING="off", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
                           "--directory", str(tmp_path), "--cores", "2", "--config",
                           "set=ablate.learning.steps=6 ablate.learning.eval_every=3", "--", "ablate_learning"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    ablate = tmp_path / "results" / "tiny" / "ablate"
    runs = pd.read_parquet(ablate / "learning.parquet")
    assert len(runs) == 10 and set(runs["dtype"]) == {"fp16", "bf16"}
    assert (runs["n"] == len(pd.read_parquet(tmp_path / "results" / "tiny" / "data" / "test.parquet"))).all()
    assert (runs["steps"] == 6).all()  # the profile's 20, set lower: the rules run each job alike
    diffs = pd.read_parquet(ablate / "learning_diffs.parquet")
    assert len(diffs) == 2 * 10 and diffs["p_holm"].between(0, 1).all()
    steps = pd.read_parquet(ablate / "learning" / "bf16-exact" / "steps.parquet")
    trained = steps["gap_max"].dropna()  # a step whose groups all scored the same has no gap
    assert len(steps) == 6 and len(trained) and (trained == 0).all()  # the exact fix: bit-identical
    assert (ablate / "learning.png").is_file() and (ablate / "learning_summary.json").is_file()


def test_the_report_shows_the_learning_tables_only_where_they_ran():
    from ratchet.report.summary import ReportInputs, build_summary

    answers = pd.concat([_answers({"none": [0, 1] * 30, "fix": [1, 1] * 30}, step=s) for s in (0, 20)])
    steps = pd.DataFrame({"dtype": "bf16", "remedy": ["none", "fix"] * 20, "step": np.repeat(range(20), 2),
                          "reward": 0.25})
    runs, diffs = run_table(steps, answers), difference_table(answers)
    text = build_summary(ReportInputs(run_name="t", learning_runs=runs, learning_diffs=diffs))
    assert "## Learning with each remedy" in text
    assert "+0.00 ± 0.00 (+0 / -0)" in text  # each run's gain over its own start
    assert "fix - none" in text and "+50.00 ± " in text  # the planted difference, established
    assert "## Learning" not in build_summary(ReportInputs(run_name="t"))


def test_the_figure_gains_a_row_of_paired_differences_when_given_them(tmp_path):
    from matplotlib.image import imread

    from ratchet.mismatch.learning import accuracy_curve
    from ratchet.report.figures import learning_figure

    rng = np.random.default_rng(2)
    start = rng.random(200) < 0.3
    answers = pd.concat([_answers({"none": start, "fix": start}, step=0, dtype="fp16"),
                         _answers({"none": start, "fix": start | (rng.random(200) < 0.3)}, step=10, dtype="fp16")],
                        ignore_index=True)
    steps = pd.DataFrame({"dtype": "fp16", "remedy": ["none"] * 10 + ["fix"] * 10, "step": list(range(10)) * 2,
                          "reward": 0.5})
    two, three = tmp_path / "two.png", tmp_path / "three.png"
    learning_figure(steps, accuracy_curve(answers), two)
    learning_figure(steps, accuracy_curve(answers), three, difference_table(answers))
    assert imread(three).shape[0] > 1.3 * imread(two).shape[0]
