"""MLflow as users read a study: each ablation variant is its own run nested under its rule's
run, under the metric names the trainings log, so the compare view draws them together."""

from __future__ import annotations

import pytest

FIX_RUNS = ["none", "fix", "exact", "tis", "mis"]


@pytest.mark.slow
def test_variants_are_nested_runs_with_shared_metric_names(tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from ratchet.config import validate
    from ratchet.stages import run_stage

    monkeypatch.setenv("RATCHET_TRACKING", "on")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("RATCHET_PIPELINE_ID", "variants-test")
    cfg = validate({"results_dir": str(tmp_path / "results"), "model": {"tiny": {"init_std": 0.1}},
                    "eval": {"max_new_tokens": 2, "num_problems": 10},
                    "ablate": {"updates": [0, 1], "visibility_updates": 1, "fix_steps": 2, "num_rollouts": 8,
                               "max_new_tokens": 2, "fix_runs": FIX_RUNS},
                    "train": {"steps": 2, "checkpoint_every": 2, "eval_every": 0, "problems_per_step": 8}})
    for stage in ("download_model", "download_data", "convert_weights", "build_engine"):
        run_stage(stage, cfg)
    for remedy in FIX_RUNS:  # the pipeline's jobs of ablate_fix_run, one a remedy
        run_stage("ablate_fix_run", cfg, job={"remedy": remedy})
        # its log (stdout in the pipeline) gets a line a step, as a training's
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[ablate_fix_run] ")]
        assert [ln.split()[1:4] for ln in lines if " step " in ln] == [[remedy, "step", str(s)] for s in range(2)]
    for stage in ("ablate_fix", "ablate_decompose", "train_colocated", "train_split"):
        run_stage(stage, cfg)

    client = MlflowClient(f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ratchet").experiment_id])
    by_id = {r.info.run_id: r for r in runs}
    rule = {r.data.tags["ratchet.stage"]: r for r in runs
            if "ratchet.stage" in r.data.tags and "ratchet.variant" not in r.data.tags}
    variants = [r for r in runs if "ratchet.variant" in r.data.tags]

    fix = {r.data.tags["ratchet.variant"]: r for r in variants
           if r.data.tags["ratchet.stage"].startswith("ablate_fix_run-")}
    assert sorted(fix) == sorted(FIX_RUNS)  # each under its job's run
    assert all(r.data.tags["mlflow.parentRunId"] == rule[f"ablate_fix_run-{name}"].info.run_id
               for name, r in fix.items())
    assert "ablate_fix" in rule  # the gather: a rule of the pipeline too
    assert all(by_id[r.data.tags["mlflow.parentRunId"]].data.tags["mlflow.parentRunId"]
               == rule["download_model"].data.tags["mlflow.parentRunId"] for r in fix.values())  # one pipeline
    names = {name: set(r.data.metrics) for name, r in fix.items()}
    assert len({frozenset(n) for n in names.values()}) == 1  # the same names in every variant
    assert {"train/reward", "mismatch/logprob_abs_diff_max"} <= names["exact"]
    assert fix["exact"].data.params["exact_forward"] == "True" and fix["tis"].data.params["is_correction"] == "tis"
    history = client.get_metric_history(fix["none"].info.run_id, "train/reward")
    assert [m.step for m in history] == [0, 1]

    sources = [r for r in variants if r.data.tags["ratchet.stage"] == "ablate_decompose"]
    assert {"fp16/total", "bf16/exact", "fp16/visibility"} <= {r.data.tags["ratchet.variant"] for r in sources}
    total = next(r for r in sources if r.data.tags["ratchet.variant"] == "fp16/total")
    assert "mismatch/logprob_abs_diff_max" in total.data.metrics

    colocated, split = (set(rule[f"train_{m}"].data.metrics) for m in ("colocated", "split"))
    shared = {"train/reward", "train/loss", "mismatch/logprob_abs_diff_max", "time/train_s"}
    assert shared <= colocated & split
    assert all(r.info.status == "FINISHED" for r in runs if r.info.run_id in
               {v.info.run_id for v in variants} | {r.info.run_id for r in rule.values()})
