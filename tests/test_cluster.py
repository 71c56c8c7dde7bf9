"""The tiny DAG through Snakemake's generic cluster executor, every job started in an empty
environment (tests/cluster/submit.sh), gives the same outputs as a local run: nothing the
stages need rides in the environment. Both run without MLflow tracking (the one variable the
submit script lets through), which took half of the cluster run's time; that tracking changes
no output is test_pipeline's `test_tracking_changes_no_output`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SUBMIT = ROOT / "tests" / "cluster" / "submit.sh"
COMPARED = ["model/manifest.json", "train/colocated/model/manifest.json", "train/split/model/manifest.json",
            "train/colocated/trace.parquet", "train/split/trace.parquet", "verify/repro.json",
            "ablate/decompose.parquet", "ablate/visibility.parquet", "ablate/fix.parquet",
            "ablate/fix_steps.parquet", "ablate/gradient.parquet", "eval/baseline_answers.parquet",
            "eval/after_colocated_answers.parquet", "eval/after_split_answers.parquet"]


def _small_profile(path: Path) -> Path:
    """The tiny profile with a few steps and problems wherever it has many, so that two runs
    of the DAG fit the slow tier: every rule still runs, and makes every output compared."""
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["train"].update(steps=4, checkpoint_every=2, eval_every=2, verify_steps=2, problems_per_step=8,
                        eval_problems=20)
    cfg["ablate"].update(updates=[0, 1, 2], visibility_updates=2, fix_steps=2, num_rollouts=8,
                         problems_per_step=4, group_size=4, eval_problems=20)
    cfg["eval"]["num_problems"] = 20
    path.write_text(yaml.safe_dump(cfg))
    return path


def _start(workdir: Path, profile: Path, *executor: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "MLFLOW_"))}
    env["RATCHET_TRACKING"] = "off"
    return subprocess.Popen([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
                             "--directory", str(workdir), "--configfile", str(profile), *executor],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def _wait(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, err[-4000:]


def _digests(run: Path) -> dict[str, str]:
    return {rel: hashlib.sha256((run / rel).read_bytes()).hexdigest() for rel in COMPARED}


@pytest.mark.slow
def test_generic_cluster_executor_in_an_empty_environment_matches_a_local_run(tmp_path):
    profile = _small_profile(tmp_path / "small.yaml")
    # side by side: the cluster run spends much of its time between a job's end and its status
    # check, and in each job's own start of Snakemake
    cluster = _start(tmp_path / "cluster", profile, "--executor", "cluster-generic",
                     "--cluster-generic-submit-cmd", str(SUBMIT), "--jobs", "2",
                     "--seconds-between-status-checks", "1", "--latency-wait", "1")
    _wait(_start(tmp_path / "local", profile, "--cores", "1"))
    _wait(cluster)
    local, cluster = (tmp_path / d / "results" / "tiny" for d in ("local", "cluster"))
    assert json.loads((cluster / "verify" / "repro.json").read_text())["identical"]
    assert _digests(cluster) == _digests(local)
