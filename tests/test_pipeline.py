"""The pipeline end to end on the tiny default: Snakemake, MLflow, reruns, bad inputs.

Runs the real `snakemake` in a temporary working directory (outputs under tmp/results), so
the checkout's own results/ is never touched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from snakemake_run import pipeline_env, snakemake_command

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
FIRST_HALF = ["download_model", "download_data", "convert_weights", "build_engine", "eval_baseline"]


def start_snakemake(workdir: Path, *args: str, tracking: str = "on") -> subprocess.Popen:
    cmd = snakemake_command(workdir, "--configfile", str(ROOT / "config" / "config.yaml"), *args, cores="2")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=pipeline_env(tracking))


def finish(proc: subprocess.Popen, check: bool = True) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{err[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def snakemake(workdir: Path, *args: str, check: bool = True, tracking: str = "on") -> subprocess.CompletedProcess:
    return finish(start_snakemake(workdir, *args, tracking=tracking), check)


def outputs_mtimes(results: Path) -> dict[str, float]:
    return {str(p.relative_to(results)): p.stat().st_mtime_ns
            for p in results.rglob("*") if p.is_file() and "logs" not in p.parts
            and "benchmarks" not in p.parts and p.suffix in (".json", ".parquet", ".safetensors")
            and not any(part.startswith(".") for part in p.relative_to(results).parts)}  # stamps, markers


@pytest.fixture(scope="module")
def first_halves(tmp_path_factory) -> tuple[Path, Path]:
    """The first half in two working directories, with MLflow tracking and without, run side
    by side (most of its jobs wait on the one before)."""
    tracked, untracked = tmp_path_factory.mktemp("pipeline"), tmp_path_factory.mktemp("untracked")
    procs = [start_snakemake(tracked, "--", *FIRST_HALF), start_snakemake(untracked, "--", *FIRST_HALF, tracking="off")]
    for proc in procs:
        finish(proc)
    return tracked, untracked


@pytest.fixture(scope="module")
def pipeline(first_halves) -> Path:
    return first_halves[0]


@pytest.mark.slow
def test_first_half_runs_and_writes_every_output(pipeline):
    work = pipeline
    run = work / "results" / "tiny"
    for rel in ["source/source.json", "data/train.parquet", "data/test.parquet",
                "model/model.safetensors", "model/manifest.json", "model/config.json",
                "model/tokenizer.json", "engine/build.json", "eval/baseline.json",
                "eval/baseline_answers.parquet"]:
        assert (run / rel).is_file(), rel
    build = json.loads((run / "engine" / "build.json").read_text())
    assert build["backend"] == "numpy" and build["selftest"]["passed"]
    baseline = json.loads((run / "eval" / "baseline.json").read_text())
    for key in ("accuracy", "format_rate", "truncated_share", "mean_tokens", "tokens_per_s", "n"):
        assert key in baseline
    assert baseline["n"] == 200


@pytest.mark.slow
def test_tracking_changes_no_output(first_halves):
    """The first half again without MLflow: the same bytes in every output the stages hash."""
    import hashlib

    work, plain = first_halves
    for rel in ["model/manifest.json", "model/tokenizer.json", "data/test.parquet", "engine/build.json",
                "eval/baseline_answers.parquet"]:
        tracked, untracked = (d / "results" / "tiny" / rel for d in (work, plain))
        if rel == "engine/build.json":  # its timings differ run to run; its self-test's results do not
            a, b = (json.loads(f.read_text())["selftest"] for f in (tracked, untracked))
            assert {k: v for k, v in a.items() if not k.endswith("_s")} == {k: v for k, v in b.items() if not k.endswith("_s")}
            continue
        assert hashlib.sha256(tracked.read_bytes()).digest() == hashlib.sha256(untracked.read_bytes()).digest(), rel
    assert not (plain / "results" / "mlflow.db").exists()


@pytest.mark.slow
def test_mlflow_holds_one_parent_and_a_child_per_rule(pipeline):
    from mlflow.tracking import MlflowClient

    work = pipeline
    client = MlflowClient(f"sqlite:///{work / 'results' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ratchet").experiment_id])
    parents = [r for r in runs if "ratchet.pipeline_id" in r.data.tags]
    children = [r for r in runs if "ratchet.stage" in r.data.tags]
    assert len(parents) == 1
    assert sorted(r.data.tags["ratchet.stage"] for r in children) == sorted(FIRST_HALF)
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in children)
    assert all(r.info.status == "FINISHED" for r in runs)
    evals = [r for r in children if r.data.tags["ratchet.stage"] == "eval_baseline"]
    assert "eval/accuracy" in evals[0].data.metrics


@pytest.mark.slow
def test_second_invocation_runs_nothing_and_forcerun_reruns_one_rule(pipeline):
    work = pipeline
    results = work / "results" / "tiny"
    before = outputs_mtimes(results)
    again = snakemake(work, "--", *FIRST_HALF)
    assert "Nothing to be done" in again.stdout + again.stderr
    assert outputs_mtimes(results) == before

    forced = snakemake(work, "--forcerun", "eval_baseline", "--", *FIRST_HALF)
    after = outputs_mtimes(results)
    changed = {k for k in before if after.get(k) != before[k]}
    assert changed == {"eval/baseline.json", "eval/baseline_answers.parquet"}, forced.stderr[-2000:]


@pytest.mark.slow
def test_unknown_config_key_fails_before_any_rule(tmp_path):
    proc = snakemake(tmp_path, "--config", "modle=x", check=False)
    assert proc.returncode != 0
    assert "unknown key 'modle'" in proc.stderr + proc.stdout
    assert not (tmp_path / "results" / "tiny").exists()


@pytest.mark.slow
def test_lint_is_clean():
    proc = subprocess.run([*SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--lint"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr
