"""The record of a finished run: what it copies and the figures summary.json computes."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dev.record import collect
from ratchet.report.tables import paired_gain


def answers(rewards) -> pd.DataFrame:
    return pd.DataFrame({"id": np.arange(len(rewards)), "reward": np.asarray(rewards, float)})


def test_paired_gain_counts_each_problem_once():
    before = answers([1, 0, 0, 1, 0, 0])
    after = answers([1, 1, 1, 0, 0, 0]).iloc[::-1]  # row order must not matter: joined on id
    g = paired_gain(before, after)
    d = np.array([0, 1, 1, -1, 0, 0], float)
    assert g["gain"] == pytest.approx(d.mean())
    assert g["gain_stderr"] == pytest.approx(d.std(ddof=1) / np.sqrt(6))
    assert (g["gain_n"], g["improved"], g["worsened"]) == (6, 2, 1)


def fake_run(root):
    (root / "eval").mkdir(parents=True)
    for name, rewards in (("baseline", [0, 0, 1, 0]), ("after_colocated", [1, 0, 1, 1])):
        acc = float(np.mean(rewards))
        (root / "eval" / f"{name}.json").write_text(json.dumps(
            {"accuracy": acc, "accuracy_stderr": 0.1, "n": len(rewards)}))
        answers(rewards).to_parquet(root / "eval" / f"{name}_answers.parquet")
    (root / "train" / "colocated").mkdir(parents=True)
    steps = pd.DataFrame({"step": range(20), "train/loss": 0.1, "train/reward": np.linspace(0, 1, 20),
                          "time/step_s": np.arange(20, dtype=float), "time/train_s": 1.0})
    steps.to_parquet(root / "train" / "colocated" / "metrics.parquet")
    (root / "verify").mkdir()
    (root / "verify" / "repro.json").write_text(json.dumps(
        {"identical": False, "colocated": {"identical": True}, "split": {"identical": False}}))
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "train_colocated.tsv").write_text("s\th:m:s\tmax_rss\n12.5\t0:00:12\t100\n")
    (root / "report").mkdir()
    (root / "report" / "summary.md").write_text("# report\n")


def test_collect_writes_the_record_and_its_summary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a git checkout
    monkeypatch.delenv("RATCHET_COMMIT", raising=False)
    run, out = tmp_path / "results" / "local", tmp_path / "records" / "h200-local"
    fake_run(run)
    samples = tmp_path / "mem.txt"
    samples.write_text("100\n4000\n250\n")
    summary = collect(run, out, wall_s=321.0, command="snakemake", gpu_samples=samples)
    assert (out / "report" / "summary.md").is_file()
    assert (out / "train" / "colocated" / "metrics.parquet").is_file()
    assert (out / "benchmarks" / "train_colocated.tsv").is_file()
    assert not out.with_name("h200-local.partial").exists()
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert summary["wall_s"] == 321.0 and summary["peak_gpu_memory_mib"] == 4000
    assert summary["baseline_accuracy"] == 0.25 and summary["after_accuracy_colocated"] == 0.75
    assert summary["after_accuracy_split"] is None  # not run: said, not invented
    assert summary["complete"] is False  # so the run did not go through to the end
    assert (out / "gpu_memory_used_mib.txt").read_text() == "100\n4000\n250\n"
    assert summary["gain_colocated"]["gain"] == pytest.approx(0.5)
    assert (summary["repro_identical"], summary["repro_identical_colocated"],
            summary["repro_identical_split"]) == (False, True, False)
    assert summary["rule_wall_s"] == {"train_colocated": 12.5}
    train = summary["train_colocated"]
    assert train["steps"] == 20 and train["median_step_s"] == pytest.approx(9.5)
    assert train["reward_last_tenth"] > train["reward_first_tenth"]
    assert (summary["commit"], summary["dirty"]) == ("unknown", None)
    monkeypatch.setenv("RATCHET_COMMIT", "abc123")  # a copied checkout's stale .git: named instead
    again = collect(run, out, command="snakemake")
    assert (again["commit"], again["dirty"]) == ("abc123", None)


def test_a_run_cut_short_is_recorded_from_its_logs_and_tables(tmp_path, monkeypatch):
    """What a run cut short still says: each finished rule's time from its log, a training's
    steps from its step lines where its metrics did not come back, and the decomposition's
    headline from its tables; a note and the fields the files cannot give, as given."""
    monkeypatch.chdir(tmp_path)
    run, out = tmp_path / "results" / "local-1.5b", tmp_path / "records" / "cut"
    logs = run / "logs"
    logs.mkdir(parents=True)
    (logs / "convert_weights.log").write_text("wrote x\n[convert_weights] done in 24.5 s\n")
    (logs / "ablate_fix.log").write_text("[ablate] cuda engine (fp16)\n")  # started, never done
    steps = ["[colocated] step    0  reward 0.500  loss +0.0013  len 294.5  2.53s  |dlogp| 6.3e-04  eval 0.600"]
    steps += [f"[colocated] step {s:4d}  reward {0.5 + s / 100:.3f}  loss -0.0100  len 250.0  1.50s  |dlogp| 5.0e-04"
              for s in range(1, 20)]
    (logs / "train_colocated.log").write_text("\n".join(steps) + "\n[train_colocated] peak GPU memory 35.2 GiB "
                                              "(this process, as nvidia-smi sees it)\n[train_colocated] done in 60.0 s\n")
    (logs / "train_split.log").write_text(
        "[split] step    0  reward 0.547  loss +0.0087  lag 0  stale 0.00  gen 1.97s  wait 0.00s  1.39s  eval 0.600\n"
        "[split] step    1  reward 0.750  loss -0.0205  lag 1  stale 1.00  gen 2.30s  wait 0.00s  0.74s\n")
    (run / "ablate").mkdir()
    rows = [{"engine_dtype": "fp16", "updates": u, "source": s, "abs_diff_max": g, "num_tokens": 100}
            for u in (0, 3) for s, g in (("total", 0.1 * (u + 1)), ("exact", 0.0))]
    pd.DataFrame(rows).to_parquet(run / "ablate" / "decompose.parquet")
    pd.DataFrame([{"update": u, "dtype": "fp16", "changed_share": 0.1 / (u + 1)} for u in (0, 1, 2, 3)]) \
        .to_parquet(run / "ablate" / "visibility.parquet")
    summary = collect(run, out, command="snakemake", note="cut short", extra={"device": "H200", "host": None})
    assert summary["rules_done_s"] == {"convert_weights": 24.5, "train_colocated": 60.0}
    assert summary["rule_gpu_peak_gib"] == {"train_colocated": 35.2}
    coloc, split = summary["train_colocated"], summary["train_split"]
    assert coloc["from"] == "log" and coloc["steps"] == 20 and coloc["median_step_s"] == 1.5
    assert coloc["steps_s"] == pytest.approx(2.53 + 19 * 1.5) and coloc["eval_by_step"] == {0: 0.6}
    assert coloc["reward_first_tenth"] == pytest.approx(0.505) and coloc["reward_last_tenth"] == pytest.approx(0.685)
    assert split["steps"] == 2 and split["steps_s"] == pytest.approx(2.13) and split["eval_by_step"] == {0: 0.6}
    headline = summary["decomposition"]
    assert headline["updates"] == 3 and headline["max_gap"] == {"fp16/total": pytest.approx(0.4), "fp16/exact": 0.0}
    assert headline["exact_max_gap_every_measurement"] == 0.0 and headline["exact_tokens_measured"] == 200
    assert headline["visible_share"] == {"fp16/update1": 0.05, "fp16/update3": 0.025}
    assert summary["complete"] is False and summary["record_note"] == "cut short"
    assert (summary["device"], summary["host"]) == ("H200", None)


SNAKEMAKE_LOG = """\
[Fri Dec  4 16:23:59 2026]
localrule download_data:
    jobid: 5
[Fri Dec  4 16:24:30 2026]
Finished jobid: 5 (Rule: download_data)
[Fri Dec  4 16:24:30 2026]
localrule build_engine:
    jobid: 2
[Fri Dec  4 16:24:44 2026]
Finished jobid: 2 (Rule: build_engine)
[Fri Dec  4 16:24:44 2026]
localrule train_split:
    jobid: 9
[Fri Dec  4 16:24:44 2026]
localrule ablate_fix_run:
    jobid: 17
    wildcards: remedy=fix
[Fri Dec  4 16:26:00 2026]
Finished jobid: 9 (Rule: train_split)
[Fri Dec  4 16:27:30 2026]
Finished jobid: 17 (Rule: ablate_fix_run)
[Fri Dec  4 16:27:40 2026]
localrule report:
    jobid: 13
[Fri Dec  4 16:27:50 2026]
Finished jobid: 13 (Rule: report)
"""


def test_the_record_says_when_each_job_ran_and_the_gpu_phase(tmp_path, monkeypatch):
    """From the Snakemake log: each job's start and end, and the GPU phase from build_engine's
    end to the last GPU rule's (the report, off the GPU, after it)."""
    monkeypatch.chdir(tmp_path)
    run, out = tmp_path / "results" / "local", tmp_path / "records" / "h200-local"
    fake_run(run)
    log = tmp_path / "snakemake.log"
    log.write_text(SNAKEMAKE_LOG)
    summary = collect(run, out, command="snakemake", snakemake_log=log)
    assert summary["timeline_s"]["ablate_fix_run (remedy=fix)"] == [45.0, 211.0]
    assert summary["timeline_s"]["report"] == [221.0, 231.0]
    assert summary["gpu_phase_s"] == {"start": 45.0, "end": 211.0, "seconds": 166.0}
    assert (out / "snakemake.log").read_text() == SNAKEMAKE_LOG


def test_collect_summarises_the_gpu_utilization(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RATCHET_COMMIT", raising=False)
    run, out = tmp_path / "results" / "local", tmp_path / "records" / "h200-local"
    fake_run(run)
    util = tmp_path / "util.txt"
    util.write_text("0\n3\n100\n97\n\n50\n")  # two idle seconds of five; a blank line is no sample
    summary = collect(run, out, gpu_util=util)
    assert summary["gpu_utilization"] == {"samples": 5, "mean_pct": 50.0, "idle_s": 2, "idle_below_pct": 5.0}
    assert (out / "gpu_utilization_pct.txt").read_text() == util.read_text()
    saved = json.loads((out / "summary.json").read_text())
    assert saved["gpu_utilization"]["idle_s"] == 2
