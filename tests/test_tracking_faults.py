"""MLflow faults are bounded: a corrupt store or a dead server stops a pipeline (or a stage run
by hand) within seconds with one line, and runs a killed process left RUNNING are closed the
next time a pipeline starts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from snakemake_run import clean_env, run_snakemake

ROOT = Path(__file__).resolve().parents[1]


_env = clean_env


def _snakemake(workdir: Path, env: dict, *targets: str) -> subprocess.CompletedProcess:
    return run_snakemake(workdir, "--", *targets, env=env, timeout=300)


def _stage(workdir: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ratchet", *args], capture_output=True, text=True,
                          env=env, cwd=workdir, timeout=300)


@pytest.mark.parametrize("store", ["garbage", "dead server", "no alembic"])
def test_a_bad_store_stops_within_seconds_with_one_line(tmp_path, store):
    (tmp_path / "results").mkdir()
    if store == "garbage":
        (tmp_path / "results" / "mlflow.db").write_text("not a database\n" * 10)
        env, named = _env(), "results/mlflow.db"
    elif store == "no alembic":  # mlflow-skinny alone: its SQL store fails in every job, not up front
        hidden = tmp_path / "hidden" / "alembic"
        hidden.mkdir(parents=True)
        (hidden / "__init__.py").write_text("raise ImportError(\"No module named 'alembic'\")\n")
        env, named = _env(PYTHONPATH=f"{hidden.parent}:{ROOT}"), "needs the alembic package"
    else:
        env, named = _env(MLFLOW_TRACKING_URI="http://127.0.0.1:1"), "http://127.0.0.1:1"
    for run in (lambda: _snakemake(tmp_path, env, "download_model"),
                lambda: _stage(tmp_path, env, "download_model")):
        start = time.monotonic()
        proc = run()
        assert time.monotonic() - start < 15
        assert proc.returncode != 0
        lines = [line for line in proc.stderr.splitlines() if line.startswith("ratchet:")]
        assert len(lines) == 1 and named in lines[0] and "RATCHET_TRACKING=off" in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results" / "tiny" / "source" / "source.json").exists()


KILLED_MID_RULE = """
import os, sys
from ratchet.config import validate
from ratchet.stages import export_to_jobs
from ratchet.tracking import StageRun
cfg = validate({"results_dir": sys.argv[1]})
export_to_jobs(cfg)
run = StageRun("train_colocated", cfg).__enter__()
print("RUN_ID", run.run_id, flush=True)
if len(sys.argv) > 2:  # a variant run under the rule's, as the ablations open
    print("VARIANT_ID", run.variant(sys.argv[2], {}).run_id, flush=True)
os._exit(9)  # as a kill -9 mid-rule: no __exit__, no onerror
"""


def test_runs_left_running_by_a_killed_pipeline_are_closed_at_the_next_start(tmp_path):
    from mlflow.tracking import MlflowClient

    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_RULE, str(results), "none"], capture_output=True,
                          text=True, env=_env(), timeout=120)
    child_id = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("RUN_ID"))
    variant_id = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("VARIANT_ID"))
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    child = client.get_run(child_id)
    parent_id = child.data.tags["mlflow.parentRunId"]
    assert child.info.status == "RUNNING" and client.get_run(parent_id).info.status == "RUNNING"

    done = _snakemake(tmp_path, _env(), "download_model")
    assert done.returncode == 0, done.stderr[-2000:]
    assert client.get_run(child_id).info.status == "KILLED"
    assert client.get_run(variant_id).info.status == "KILLED"  # was left RUNNING under its rule's run
    assert client.get_run(parent_id).info.status == "KILLED"
    experiment = client.get_experiment(child.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on runs


def test_a_marker_of_a_run_the_store_does_not_hold_is_dropped_not_fatal(tmp_path):
    """After the store was moved aside (as its corrupt-store message advises), a killed
    pipeline's marker named a run the new store lacks: every later start failed on it."""
    markers = tmp_path / "results" / ".pipelines"
    markers.mkdir(parents=True)
    (markers / "gone.json").write_text('{"run_id": "dd99b4b7378a4957addca2573dbdb974"}')
    (markers / "garbled.json").write_text("{")
    done = _snakemake(tmp_path, _env(), "download_model")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "could not be closed" in done.stderr and "its marker removed" in done.stderr
    assert not list(markers.glob("gone.json")) and not list(markers.glob("garbled.json"))


def test_a_store_it_cannot_write_is_named_before_any_work(tmp_path, monkeypatch):
    """A read-only store passed the up-front check (opened read-only) and failed at the stage's
    first write, after its work. (Root writes past file modes, so os.access stands in for a
    read-only mount here.)"""
    from ratchet import tracking_store
    from ratchet.tracking_store import TrackingStoreError, check_store

    db = tmp_path / "mlflow.db"
    sqlite3_db(db)
    check_store(f"sqlite:///{db}")
    monkeypatch.setattr(tracking_store.os, "access", lambda p, mode: Path(p) != tmp_path)
    with pytest.raises(TrackingStoreError, match=f"{tmp_path} is not writable here"):
        check_store(f"sqlite:///{db}")


def sqlite3_db(path: Path) -> None:
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("create table t (x)")


def test_the_worker_names_the_cause_beneath_sqlalchemys_first_line():
    import sqlite3

    from ratchet.tracking_worker import describe

    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.Error as e:
            raise RuntimeError("(raised as a result of Query-invoked autoflush; consider using a "
                               "session.no_autoflush block)\nmore") from e
    except RuntimeError as e:
        said = describe(e)
    assert said == ("RuntimeError: (raised as a result of Query-invoked autoflush; consider using a "
                    "session.no_autoflush block) (cause: OperationalError: database or disk is full)")
    assert describe(ValueError("plain")) == "ValueError: plain"


def test_runs_of_a_killed_hand_run_stage_are_closed_at_the_next_pipeline_start(tmp_path):
    """A stage run by hand has no pipeline run to find its runs by: killed, it and its variants
    stayed RUNNING for good. It leaves a marker of its own, which the next pipeline start
    closes, unless its process is still alive."""
    import json
    import os
    import socket

    from mlflow.tracking import MlflowClient

    results = tmp_path / "results"
    script = KILLED_MID_RULE.replace("export_to_jobs(cfg)\n", "")  # no pipeline: by hand
    proc = subprocess.run([sys.executable, "-c", script, str(results), "none"], capture_output=True,
                          text=True, env=_env(), timeout=120)
    ids = {line.split()[0]: line.split()[1] for line in proc.stdout.splitlines() if "_ID" in line}
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    assert all(client.get_run(i).info.status == "RUNNING" for i in ids.values())
    assert "mlflow.parentRunId" not in client.get_run(ids["RUN_ID"]).data.tags
    alive = results / ".pipelines" / "hand-alive.json"  # a hand run still working: left alone
    alive.write_text(json.dumps({"run_id": "x", "host": socket.gethostname(), "pid": os.getpid()}))

    done = _snakemake(tmp_path, _env(), "download_model")
    assert done.returncode == 0, done.stderr[-2000:]
    assert [client.get_run(i).info.status for i in ids.values()] == ["KILLED", "KILLED"]
    assert sorted(p.name for p in (results / ".pipelines").glob("hand-*.json")) == ["hand-alive.json"]


def test_a_worker_whose_stage_is_gone_ends_quietly():
    """A killed stage's worker wrote its reply into the broken pipe and printed a traceback
    into the stage's log; it now ends with status 1 and nothing to say."""
    from ratchet.tracking_worker import work

    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    assert work(iter(()), Gone()) == 1
