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
