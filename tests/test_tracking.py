"""MLflow tracking: parent and child runs, params, tags, stepped metrics, hashed outputs."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from ratchet import config as cfgmod
from ratchet import tracking
from ratchet.tracking import SOCKET_ENV


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("RATCHET_TRACKING", "on")
    return cfgmod.validate({"results_dir": str(tmp_path / "results")})


@pytest.fixture(params=["own process", "forkserver"])
def transport(request, monkeypatch):
    """A stage's worker as a process of its own (by hand), or forked by the pipeline's server."""
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    if request.param == "own process":
        yield request.param
        return
    tracking.start_forkserver()
    assert SOCKET_ENV in os.environ
    yield request.param
    path = json.loads(os.environ.pop(SOCKET_ENV))["path"]
    server = tracking._forkserver.pop()
    server.stdin.close()  # as when Snakemake ends
    assert server.wait(timeout=60) == 0 and not os.path.exists(path)


def git_checkout(where) -> str:
    """A fresh repository with one commit; its HEAD."""
    where.mkdir(parents=True, exist_ok=True)
    run = lambda *a: subprocess.run(["git", "-C", str(where), *a], check=True,  # noqa: E731
                                    capture_output=True, text=True).stdout.strip()
    run("init", "-q")
    (where / "f.txt").write_text("1")
    run("add", "f.txt")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return run("rev-parse", "HEAD")


def test_code_version_is_the_working_directory_s_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tracking.code_version() == {"git.commit": "unknown", "git.dirty": "unknown"}
    head = git_checkout(tmp_path / "repo")
    monkeypatch.chdir(tmp_path / "repo")
    assert tracking.code_version() == {"git.commit": head, "git.dirty": "false"}
    (tmp_path / "repo" / "f.txt").write_text("2")
    assert tracking.code_version() == {"git.commit": head, "git.dirty": "true"}


def test_stage_runs_nest_under_one_parent(cfg, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    head = git_checkout(tmp_path / "repo")
    monkeypatch.chdir(tmp_path / "repo")  # the tags name the checkout the stages run in
    monkeypatch.setenv(tracking.PIPELINE_ENV, "abc123")
    out = tmp_path / "out.json"
    out.write_text(json.dumps({"x": 1}))
    for stage in ("one", "two"):
        with tracking.StageRun(stage, cfg) as run:
            for step in range(3):
                run.log_metrics({"train/loss": 1.0 / (step + 1)}, step=step)
            digest = run.log_output(out)
    tracking.end_pipeline(cfg["results_dir"], "FINISHED")

    client = MlflowClient(tracking.tracking_uri(tmp_path / "results"))
    exp = client.get_experiment_by_name("ratchet")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "ratchet.pipeline_id" in r.data.tags]
    children = [r for r in runs if "ratchet.stage" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert parents[0].info.status == "FINISHED"
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert child.data.params["model.source"] == "tiny"
        assert child.data.tags["git.commit"] == head and child.data.tags["git.dirty"] == "false"
        assert child.data.tags["sha256.out.json"] == digest
        history = client.get_metric_history(child.info.run_id, "train/loss")
        assert [m.step for m in history] == [0, 1, 2]
        assert child.info.status == "FINISHED"


def test_failed_stage_is_marked_failed(cfg, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv(tracking.PIPELINE_ENV, raising=False)
    with pytest.raises(RuntimeError):
        with tracking.StageRun("boom", cfg):
            raise RuntimeError("stage failed")
    client = MlflowClient(tracking.tracking_uri(tmp_path / "results"))
    (run,) = client.search_runs([client.get_experiment_by_name("ratchet").experiment_id])
    assert run.info.status == "FAILED" and "mlflow.parentRunId" not in run.data.tags


def test_directory_hash_changes_with_content(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a").write_text("1")
    h1 = tracking.sha256_of(d)
    (d / "a").write_text("2")
    assert tracking.sha256_of(d) != h1


def test_a_store_the_worker_cannot_use_fails_the_stage_at_its_end_with_one_line(cfg, tmp_path, monkeypatch,
                                                                                 transport):
    """The writes happen in the stage's tracking worker: a store that fails there (no up-front
    check_store, as a stage called directly) fails the stage when it ends, naming the cause and
    the way out; a stage's own error is not masked by it."""
    from ratchet.tracking_store import TrackingStoreError

    bad = tmp_path / "bad.db"
    bad.write_text("not a database\n" * 10)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{bad}")
    with pytest.raises(TrackingStoreError) as failed:
        with tracking.StageRun("one", cfg) as run:
            run.log_metrics({"train/loss": 1.0})
            assert run.run_id is None  # the worker stopped before it made the run
    message = str(failed.value)
    assert "MLflow tracking of one failed" in message and "RATCHET_TRACKING=off" in message
    assert "\n" not in message
    with pytest.raises(RuntimeError, match="stage failed"):
        with tracking.StageRun("two", cfg):
            raise RuntimeError("stage failed")


def test_variants_get_runs_of_their_own_and_ids_on_demand(cfg, tmp_path, transport, capfd):
    from mlflow.tracking import MlflowClient

    with tracking.StageRun("ablate", cfg) as run:
        assert (run._worker.sock is not None) == (transport == "forkserver")
        run.variant("fp16/none", {"lr": 1e-6}).log_metrics({"gap": 0.5}, step=3)
        child_id = run.variant("fp16/none").run_id
        stage_id = run.run_id
    client = MlflowClient(tracking.tracking_uri(tmp_path / "results"))
    child = client.get_run(child_id)
    assert child.data.tags["mlflow.parentRunId"] == stage_id and child.data.params["lr"] == "1e-06"
    assert child.data.metrics["gap"] == 0.5 and child.info.status == "FINISHED"
    assert client.get_run(stage_id).info.status == "FINISHED"
    assert f"MLflow run {stage_id} (ablate)" in capfd.readouterr().out  # the stage's output, forked or not


def test_a_stage_without_a_usable_server_starts_its_own_worker(cfg, monkeypatch):
    """No socket at the address (the server ended), or one of another interpreter or host:
    the stage's worker is a process of its own, and the run is made all the same."""
    for where in (tracking.forkserver_address("/nonexistent/ratchet.sock"),
                  json.dumps({"host": "elsewhere", "python": "x", "path": "/tmp/x.sock"}), "not json"):
        monkeypatch.setenv(SOCKET_ENV, where)
        with tracking.StageRun("one", cfg) as run:
            assert run._worker.sock is None
            assert run.run_id


SQL_STORE = "mlflow.store.tracking.sqlalchemy_store"


@pytest.mark.parametrize("sqlalchemy", ["installed", "missing"])
def test_import_sql_store_imports_the_store_a_worker_opens_or_the_client_alone(sqlalchemy):
    """What the forkserver (and Snakemake's process) import once so that no forked worker
    imports MLflow's SQL store again; without SQLAlchemy the client still comes, no error."""
    hide = "import sys; sys.modules['sqlalchemy'] = None; " if sqlalchemy == "missing" else ""
    code = (f"{hide}import sys; from ratchet.tracking import import_sql_store; import_sql_store(); "
            f"print('mlflow.tracking' in sys.modules, '{SQL_STORE}' in sys.modules)")
    out = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True" if sqlalchemy == "installed" else "False"]


@pytest.mark.parametrize("transport", ["forkserver"], indirect=True)
def test_the_forkserver_holds_the_sql_store_before_it_forks_a_worker(cfg, transport):
    """The server's own memory maps SQLAlchemy's compiled extensions once a worker has been
    served (the server imports before it accepts): the forked workers inherit them."""
    import sqlalchemy

    ext = os.path.join(os.path.dirname(sqlalchemy.__file__), "cyextension")
    if not os.path.isdir(ext) or not os.path.exists("/proc/self/maps"):
        pytest.skip("needs SQLAlchemy's compiled extensions and /proc")
    with tracking.StageRun("one", cfg) as run:
        assert run.run_id
    maps = open(f"/proc/{tracking._forkserver[-1].pid}/maps").read()
    assert ext in maps


def test_a_stalled_store_does_not_stall_the_stage(cfg, tmp_path, transport):
    """The store's lock held elsewhere (a stuck writer, a server gone quiet): the worker stops
    reading, and the stage's writes used to block in the full pipe (no bound) or raise a socket
    timeout from log_metrics. The stage's own work goes on; its writes land once the store
    answers again."""
    import fcntl
    import threading

    from mlflow.tracking import MlflowClient

    results = Path(cfg["results_dir"])
    results.mkdir(parents=True)
    held = open(results / ".mlflow.lock", "w")
    fcntl.flock(held, fcntl.LOCK_EX)
    run = tracking.StageRun("stalled", cfg).__enter__()
    logged = threading.Event()

    def work():  # ~0.5 MB of messages: far past what a pipe or socket buffers
        for step in range(120):
            run.log_metrics({f"m/{i}": float(i) for i in range(100)}, step)
        logged.set()

    threading.Thread(target=work, daemon=True).start()
    finished = logged.wait(timeout=120)  # generous: seconds on any machine, forever before
    fcntl.flock(held, fcntl.LOCK_UN)
    held.close()
    assert finished, "log_metrics blocked while the store was stalled"
    run.__exit__(None, None, None)
    client = MlflowClient(tracking.tracking_uri(results))
    [stalled] = client.search_runs([client.get_experiment_by_name("ratchet").experiment_id])
    assert stalled.info.status == "FINISHED" and len(client.get_metric_history(stalled.info.run_id, "m/7")) == 120
