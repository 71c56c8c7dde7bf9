"""The tiny DAG through Snakemake's generic cluster executor, every job started in an empty
environment (tests/cluster/submit.sh), gives the same outputs as a local run without MLflow
tracking: nothing the stages need rides in the environment, and tracking changes no output."""

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
            "ablate/fix_steps.parquet", "eval/baseline_answers.parquet",
            "eval/after_colocated_answers.parquet", "eval/after_split_answers.parquet"]


def _small_profile(path: Path) -> Path:
    """The tiny profile with fewer steps, so that two runs of the DAG fit the slow tier."""
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["train"].update(steps=12, checkpoint_every=6, eval_every=6, verify_steps=2)
    cfg["ablate"].update(updates=[0, 1, 3], visibility_updates=3, fix_steps=4, num_rollouts=16)
    cfg["eval"]["num_problems"] = 50
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(workdir: Path, profile: Path, *executor: str, tracking: bool = True) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "MLFLOW_"))}
    if not tracking:
        env["RATCHET_TRACKING"] = "off"
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
                           "--directory", str(workdir), "--configfile", str(profile), *executor],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _digests(run: Path) -> dict[str, str]:
    return {rel: hashlib.sha256((run / rel).read_bytes()).hexdigest() for rel in COMPARED}


@pytest.mark.slow
def test_generic_cluster_executor_in_an_empty_environment_matches_a_local_run(tmp_path):
    profile = _small_profile(tmp_path / "small.yaml")
    # the reference without MLflow (half of its time on the tiny DAG), the cluster's jobs with it
    # (their empty environment leaves tracking on): outputs that match show neither the
    # environment nor tracking reaches them
    _run(tmp_path / "local", profile, "--cores", "2", tracking=False)
    _run(tmp_path / "cluster", profile, "--executor", "cluster-generic",
         "--cluster-generic-submit-cmd", str(SUBMIT), "--jobs", "2",
         "--seconds-between-status-checks", "1", "--latency-wait", "1")
    local, cluster = (tmp_path / d / "results" / "tiny" for d in ("local", "cluster"))
    assert json.loads((cluster / "verify" / "repro.json").read_text())["identical"]
    assert _digests(cluster) == _digests(local)
