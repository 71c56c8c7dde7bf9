"""The report renders with any subset of the run's outputs: "not run" for what is missing."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd

from ratchet.config import validate
from ratchet.mismatch.ablation import AblateSettings
from ratchet.mismatch.decompose import SOURCES
from ratchet.paths import RunPaths
from ratchet.report import figures, tables
from ratchet.report.summary import ReportInputs, build_summary
from ratchet.stages.ablate import records
from ratchet.stages.report import report, training_inputs, training_paths

PNG = b"\x89PNG\r\n\x1a\n"


class FakeRun:
    """The StageRun surface a stage uses, recording instead of tracking."""

    def __init__(self):
        self.outputs, self.tags, self.metrics = [], {}, []

    def log_output(self, path, name=None):
        self.outputs.append(path)

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_metrics(self, metrics, step=0):
        self.metrics.append((step, metrics))


def decompose_frame() -> pd.DataFrame:
    rows = []
    for updates in (0, 1, 3, 10, 30):
        for k, dtype in enumerate(("fp16", "bf16")):
            for j, source in enumerate(SOURCES):
                value = 0.0 if (updates == 0 and source == "weight_rounding") or source == "exact" \
                    else 1e-4 * (1 + j) * 8 ** k
                rows.append({"updates": updates, "steps": updates, "engine_dtype": dtype,
                             "source": source, "reference": "a", "against": "b",
                             "abs_diff_mean": value / 4, "abs_diff_p99": value / 2, "abs_diff_max": value,
                             "ratio_outside_share": 0.0, "kl_k3": 1e-9, "num_tokens": 100})
    return pd.DataFrame(rows)


def visibility_frame() -> pd.DataFrame:
    rows = [{"update": u, "steps": u, "dtype": d, "moved_share": float(u > 0),
             "changed_share": 0.0 if u == 0 else (0.07 if d == "fp16" else 3e-4),
             "off_grid_share": 0.0 if (u == 0 and d == "fp16") else 0.9}
            for u in range(0, 31) for d in ("fp16", "bf16")]
    return pd.DataFrame(rows)


def fix_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    steps = pd.DataFrame([{"run": r, "step": s, "updates": s, "reward": 0.1 * s,
                           "gap_mean": np.nan if s == 2 else 1e-3 / (10 if r == "fix" else 1),
                           "gap_p99": 2e-3, "gap_max": 1e-2 / (10 if r == "fix" else 1),
                           "ratio_outside_share": 0.0, "kl_k3": 0.0, "num_tokens": 10.0,
                           "is_weight_mean": 1.0, "is_masked_share": 0.0, "clip_fraction": 0.0}
                          for r in ("none", "fix", "exact", "tis", "mis") for s in range(5)])
    steps.loc[steps["run"] == "exact", "gap_max"] = 0.0  # bit-identical: drawn at 2^-20
    runs = pd.DataFrame([{"run": r, "steps": 5, "updates": 5,
                          "weight_dtype": "fp16" if r == "fix" else "fp32",
                          "is_correction": r if r in ("tis", "mis") else "none", "accuracy": 0.5,
                          "accuracy_stderr": 0.05, "eval_n": 100, "reward_last_fifth": 0.4,
                          "final_gap_mean": 1e-3, "final_gap_p99": 2e-3,
                          "final_gap_max": {"fix": 1e-3, "exact": 0.0}.get(r, 1e-1),
                          "final_ratio_outside_share": 0.0, "final_kl_k3": 0.0}
                         for r in ("none", "fix", "exact", "tis", "mis")])
    return steps, runs


def test_summary_with_nothing_run_says_not_run():
    text = build_summary(ReportInputs(run_name="x"))
    for heading in ("## Accuracy", "## Training: seconds per step", "## Where the gap comes from",
                    "## Which updates the engine sees", "## The fix", "## Records",
                    "## Reproducibility"):
        assert heading in text
    assert text.count("not run") >= 10
    assert "_decomposition: not run._" in text and "_ablation records: not run._" in text


def test_report_stage_renders_an_empty_run(tmp_path):
    cfg = validate({"results_dir": str(tmp_path)})
    run = FakeRun()
    report(cfg, run)
    paths = RunPaths.from_config(cfg)
    text = paths.report_summary.read_text()
    assert "# ratchet report: `tiny`" in text and "not run" in text
    assert paths.report_training_figure.read_bytes().startswith(PNG)  # a "not run" placeholder
    assert run.tags["report.not_run"].startswith("baseline")
    assert paths.report_summary in run.outputs


def test_report_stage_with_ablations_and_one_training_mode(tmp_path):
    cfg = validate({"results_dir": str(tmp_path)})
    paths = RunPaths.from_config(cfg)
    paths.ablate.mkdir(parents=True)
    dec, vis = decompose_frame(), visibility_frame()
    steps, runs = fix_frames()
    dec.to_parquet(paths.decompose_table)
    vis.to_parquet(paths.visibility_table)
    steps.to_parquet(paths.fix_steps)
    runs.to_parquet(paths.fix_table)
    figures.decomposition_figure(dec, paths.decompose_figure)
    figures.visibility_figure(vis, paths.visibility_figure)
    figures.fix_figure(steps, paths.fix_figure)
    paths.eval_json("baseline").parent.mkdir(parents=True)
    paths.eval_json("baseline").write_text(json.dumps(
        {"n": 100, "accuracy": 0.25, "accuracy_stderr": 0.04, "format_rate": 1.0,
         "mean_tokens": 3.0, "tokens_per_s": 50.0}))
    metrics = paths.root / "train" / "colocated" / "metrics.parquet"
    metrics.parent.mkdir(parents=True)
    pd.DataFrame({"step": range(4), "train/loss": 0.1, "train/reward": [0.1, 0.2, 0.3, 0.4],
                  "time/step_s": 2.0, "time/generate_s": 1.5, "time/train_s": 0.4, "time/sync_s": 0.1,
                  "mismatch/logprob_abs_diff_mean": 1e-3, "mismatch/logprob_abs_diff_max": 1e-2,
                  "mismatch/logprob_abs_diff_p99": 5e-3, "mismatch/ratio_outside_share": 0.0,
                  "mismatch/kl_k3": 1e-7}).to_parquet(metrics)

    run = FakeRun()
    report(cfg, run)
    text = paths.report_summary.read_text()
    rec = json.loads(paths.ablate_summary.read_text())  # the report writes the records
    assert rec == {**records(AblateSettings.from_config(cfg), dec, vis, runs),
                   "run_name": "tiny", "backend": None}
    assert paths.ablate_summary in run.outputs
    assert "| baseline | 25.00% ± 4.00 |  | 100 |" in text
    assert "| after colocated | not run | not run |" in text and "| split | not run | not run |" in text
    assert "| colocated | 4 | 2 | 1.5 | 0.4 | 0.1 |" in text  # seconds per step
    assert "(../ablate/decompose.png)" in text and "(../ablate/fix.png)" in text
    assert "(training.png)" in text
    for source in SOURCES:
        assert f"fp16 {source}" in text and f"bf16 {source}" in text
    # total (4e-4) over exact (0, counted as 2^-20) after 30 updates, fp16 (the pipeline's engine
    # dtype): a lower bound; over fixed (5e-4), the rounded weights alone
    assert rec["fix_max_gap_ratio"] == 4e-4 * 2 ** 20 and rec["fix_max_gap_ratio_is_lower_bound"] is True
    assert "| fix_max_gap_ratio | 419.4 |" in text
    assert rec["fix_rounding_only_max_gap_ratio"] == 0.8 and rec["exact_max_gap"] == 0.0
    assert rec["fix_max_gap_ratio_by_updates"]["bf16"]["3"] == 4e-4 * 8 * 2 ** 20
    assert "| fp16 | rounded weights (total / fixed) | 0.8 |" in text
    assert rec["visibility_fp16_update1"] == 0.07 and rec["visibility_bf16_update1"] == 3e-4
    assert rec["fix_runs_max_gap_ratio"] == 0.1 * 2 ** 20 and rec["fix_runs_rounding_only_max_gap_ratio"] == 100.0
    assert "report.not_run" in run.tags and "decompose" not in run.tags["report.not_run"]
    for fig in (paths.decompose_figure, paths.visibility_figure, paths.fix_figure,
                paths.report_training_figure):
        assert fig.read_bytes().startswith(PNG) and fig in run.outputs


def test_the_report_rule_waits_only_for_training_outputs_some_rule_makes(tmp_path):
    paths = RunPaths(tmp_path, "tiny")
    made = [str(p) for p in training_paths(paths)][:2]
    rules = [SimpleNamespace(output=[made[0], "elsewhere.json"]), SimpleNamespace(output=[made[1]])]
    assert training_inputs(paths, rules) == sorted(made)
    assert training_inputs(paths, []) == []


def test_markdown_escapes_pipes_and_formats_numbers():
    df = pd.DataFrame({"mean |dlogp|": [1.5e-5, 0.25], "n": [3, 1200], "what": ["a|b", None]},
                      dtype=object)
    text = tables.markdown(df)
    assert text.splitlines()[0] == "| mean \\|dlogp\\| | n | what |"
    assert "| 1.50e-05 | 3 | a\\|b |" in text and "| 0.25 | 1,200 | not run |" in text


def test_accuracy_table_states_the_paired_gain():
    before = pd.DataFrame({"id": range(4), "reward": [0.0, 0.0, 1.0, 0.0]})
    after = pd.DataFrame({"id": range(4), "reward": [1.0, 0.0, 1.0, 1.0]})
    gain = tables.paired_gain(before, after)
    evals = {"baseline": {"accuracy": 0.25, "n": 4}, "after colocated": {"accuracy": 0.75, "n": 4}}
    table = tables.accuracy_table(evals, {"after colocated": gain})
    row = table.set_index("eval").loc["after colocated", "gain (paired)"]
    assert row.startswith("+50.00 ± 28.87 points (+2 / -0)")
    assert table.set_index("eval").loc["baseline", "gain (paired)"] == ""


def test_the_summary_is_also_a_page_with_real_tables():
    from ratchet.stages.report import summary_html

    page = summary_html("# run\n\n| a | b |\n|---|---|\n| 1 | 2 |\n", "tiny")
    assert "<table>" in page and "<th>a</th>" in page and "<td>2</td>" in page
    assert page.startswith("<!DOCTYPE html>") and "<title>ratchet tiny</title>" in page


def test_vllm_beside_ratchet_shows_in_the_report_only_once_its_table_is_there(tmp_path):
    cfg = validate({"results_dir": str(tmp_path)})
    paths = RunPaths.from_config(cfg)
    report(cfg, FakeRun())
    assert "vLLM beside ratchet's engine" not in paths.report_summary.read_text()
    both = pd.concat([decompose_frame().assign(backend=b) for b in ("cuda", "vllm")], ignore_index=True)
    both = both[both["engine_dtype"] == "fp16"]
    both.loc[both["backend"] == "vllm", "abs_diff_mean"] *= 1.5
    both.to_parquet(paths.decompose_vllm_table)
    figures.decomposition_figure(tables.by_engine(both), paths.decompose_vllm_figure)
    report(cfg, FakeRun())
    text = paths.report_summary.read_text()
    assert "### vLLM beside ratchet's engine" in text and "(../ablate/decompose_vllm.png)" in text
    wide = tables.decomposition_compact(tables.by_engine(both), "abs_diff_mean")
    assert {"ratchet fp16 total", "vLLM fp16 total"} <= set(wide.columns)
    assert np.allclose(wide["vLLM fp16 total"], 1.5 * wide["ratchet fp16 total"])


def test_an_on_demand_table_made_under_other_settings_is_left_out_saying_why(tmp_path, capsys):
    """The vLLM decomposition and the learning runs are read where they are (no rule makes
    them for the report): one made before an ablate.* edit was shown as this run's."""
    from ratchet.stages.guard import write_stamp

    before = validate({"results_dir": str(tmp_path), "ablate": {"updates": [0, 1]}})
    paths = RunPaths.from_config(before)
    paths.decompose_vllm_table.parent.mkdir(parents=True)
    both = pd.concat([decompose_frame().assign(backend=b) for b in ("cuda", "vllm")], ignore_index=True)
    both.to_parquet(paths.decompose_vllm_table)
    write_stamp("ablate_decompose_vllm", before)
    paths.learning_summary.write_text(json.dumps({"learning_steps": 20}))
    write_stamp("ablate_learning", before)
    report(before, FakeRun())
    assert "### vLLM beside ratchet's engine" in paths.report_summary.read_text()

    after = validate({"results_dir": str(tmp_path), "ablate": {"updates": [0, 3]}})
    report(after, FakeRun())
    assert "vLLM beside ratchet's engine" not in paths.report_summary.read_text()
    assert "learning_steps" not in json.loads(paths.ablate_summary.read_text())
    out = capsys.readouterr().out
    assert "ablate_decompose_vllm's outputs were made under other settings (ablate.updates:" in out
    assert "ablate_learning's outputs were made under other settings" in out
