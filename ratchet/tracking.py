"""MLflow tracking: one parent run per pipeline invocation, one child run per stage, so every
output can be traced to its config, code and machine. Stages run as concurrent processes, so
every write to the store goes through one file lock; `RATCHET_TRACKING=off` makes it a no-op."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

PIPELINE_ENV = "RATCHET_PIPELINE_ID"
# MLflow's UI opens an experiment of this kind on its runs, not on the GenAI traces view
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# a dead tracking server costs seconds, not MLflow's default minutes of retries
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
PACKAGES = ("ratchet", "torch", "numpy", "cupy-cuda13x", "cupy-cuda12x", "mlflow", "snakemake",
            "transformers", "safetensors", "datasets", "gguf")


def enabled() -> bool:
    return os.environ.get("RATCHET_TRACKING", "on").lower() not in ("0", "off", "false", "no")


def tracking_uri(results_dir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(results_dir).resolve()}/mlflow.db"


_lock_depth = 0  # flock is not re-entrant across file descriptors: count nested holds


@contextlib.contextmanager
def store_lock(results_dir: Path):
    """Serialise writers across processes: SQLite allows one, and parent creation must
    happen once. Re-entrant within a process."""
    global _lock_depth
    if _lock_depth:
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1
        return
    results_dir.mkdir(parents=True, exist_ok=True)
    with open(results_dir / ".mlflow.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _lock_depth = 1
        try:
            yield
        finally:
            _lock_depth = 0
            fcntl.flock(f, fcntl.LOCK_UN)


def sha256_of(path: Path) -> str:
    """SHA-256 of a file, or of a directory as the hash of its files' names and hashes."""
    path = Path(path)
    if path.is_file():
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    h = hashlib.sha256()
    for child in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{child.relative_to(path)}\0{sha256_of(child)}\n".encode())
    return h.hexdigest()


def code_version() -> dict[str, str]:
    """The commit of the checkout the pipeline runs in (the working directory), never of the
    installed package's location, which a wheel puts in site-packages: "unknown" outside git."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(Path.cwd()), *args],
                                 capture_output=True, text=True, timeout=10)
        except OSError:  # no git on this machine
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"git.commit": "unknown", "git.dirty": "unknown"}
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"git.commit": commit, "git.dirty": str(bool(dirty)).lower()}


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[f"version.{name}"] = metadata.version(name)
    out["version.python"] = platform.python_version()
    return out


def device_name() -> str:
    from ratchet.device import (
        describe,  # local: cheap, but keeps this module import-light
    )

    return describe()


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if not isinstance(v, str) else v
    return out


class StageRun:
    """Context manager around one stage: params, tags, metrics with steps, outputs."""

    def __init__(self, stage: str, cfg: dict):
        self.stage = stage
        self.cfg = cfg
        self.results_dir = Path(cfg["results_dir"])
        self.max_artifact_bytes = cfg["tracking"]["max_artifact_mb"] * 2**20
        self.client = None
        self.run_id: str | None = None
        self._metrics: list = []
        self._children: dict[str, StageRun] = {}

    # -- lifecycle --------------------------------------------------------------------
    def __enter__(self) -> "StageRun":
        if not enabled():
            return self
        from mlflow.tracking import MlflowClient

        for key, value in HTTP_LIMITS.items():
            os.environ.setdefault(key, value)
        with store_lock(self.results_dir):
            self.client = MlflowClient(tracking_uri(self.results_dir))
            experiment_id = self.experiment_id = self._experiment_id()
            tags = {"ratchet.stage": self.stage, "ratchet.run_name": self.cfg["run_name"],
                    "device": device_name(), **code_version(), **package_versions()}
            parent = self._parent_run(experiment_id)
            if parent:
                tags["mlflow.parentRunId"] = parent
            run = self.client.create_run(experiment_id, tags=tags,
                                         run_name=f"{self.cfg['run_name']}/{self.stage}")
            self.run_id = run.info.run_id
            self._log_batch(params=flatten(self.cfg))
        print(f"[tracking] MLflow run {self.run_id} ({self.stage}) at {tracking_uri(self.results_dir)}")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.client is None:
            return
        status = "FAILED" if exc_type else "FINISHED"
        for child in self._children.values():
            child.flush()
            with store_lock(self.results_dir):
                self.client.set_terminated(child.run_id, status)
        self.flush()
        with store_lock(self.results_dir):
            self.client.set_terminated(self.run_id, status)

    def variant(self, name: str, params: dict | None = None) -> "StageRun":
        """A run nested under this one for one variant of the stage (an ablation run, a source
        of the gap): MLflow's compare view then sets variants side by side under shared
        metric names. Created on first use, closed with this run."""
        child = self._children.get(name)
        if child is None:
            child = self._children[name] = StageRun(self.stage, self.cfg)
            if self.client is not None:
                child.client = self.client
                tags = {"mlflow.parentRunId": self.run_id, "ratchet.stage": self.stage,
                        "ratchet.variant": name, "ratchet.run_name": self.cfg["run_name"]}
                with store_lock(self.results_dir):
                    run = self.client.create_run(self.experiment_id, tags=tags,
                                                 run_name=f"{self.cfg['run_name']}/{self.stage}/{name}")
                child.run_id = run.info.run_id
                child._log_batch(params={"variant": name, **{k: str(v) for k, v in (params or {}).items()}})
        return child

    # -- logging ----------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._metrics += [Metric(k, float(v), now, int(step)) for k, v in metrics.items()
                          if v is not None]
        if len(self._metrics) >= 900:
            self.flush()

    def set_tags(self, tags: dict[str, str]) -> None:
        if self.client is not None:
            self._log_batch(tags={k: str(v) for k, v in tags.items()})

    def log_output(self, path: Path, name: str | None = None) -> str:
        """Record an output's SHA-256 as a tag, and copy it as an artifact if small enough."""
        path = Path(path)
        digest = sha256_of(path)
        if self.client is None:
            return digest
        name = name or path.name
        self.set_tags({f"sha256.{name}": digest})
        size = path.stat().st_size if path.is_file() else sum(
            p.stat().st_size for p in path.rglob("*") if p.is_file())
        if size <= self.max_artifact_bytes:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
            else:
                self.client.log_artifacts(self.run_id, str(path), artifact_path=name)
        return digest

    def flush(self) -> None:
        while self._metrics:
            batch, self._metrics = self._metrics[:900], self._metrics[900:]
            self._log_batch(metrics=batch)

    # -- internals --------------------------------------------------------------------
    def _log_batch(self, metrics=(), params=None, tags=None) -> None:
        from mlflow.entities import Param, RunTag

        with store_lock(self.results_dir):
            self.client.log_batch(
                self.run_id, metrics=list(metrics),
                params=[Param(k, v[:6000]) for k, v in (params or {}).items()],
                tags=[RunTag(k, v[:5000]) for k, v in (tags or {}).items()])

    def _experiment_id(self) -> str:
        name = self.cfg["tracking"]["experiment"]
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            location = None
            if "MLFLOW_TRACKING_URI" not in os.environ:  # keep artifacts beside the SQLite store
                location = (self.results_dir.resolve() / "mlartifacts").as_uri()
            exp = self.client.get_experiment(self.client.create_experiment(name, artifact_location=location))
        if exp.tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:
            self.client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
        return exp.experiment_id

    def _parent_run(self, experiment_id: str) -> str | None:
        pipeline_id = os.environ.get(PIPELINE_ENV)
        if not pipeline_id:
            return None
        marker = self.results_dir / ".pipelines" / f"{pipeline_id}.json"
        if marker.is_file():
            return json.loads(marker.read_text())["run_id"]
        tags = {"ratchet.pipeline_id": pipeline_id, "ratchet.run_name": self.cfg["run_name"],
                "device": device_name(), **code_version()}
        run = self.client.create_run(experiment_id, tags=tags,
                                     run_name=f"{self.cfg['run_name']}/pipeline")
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"run_id": run.info.run_id}))
        return run.info.run_id


def end_pipeline(results_dir: str | Path, status: str) -> None:
    """Close the invocation's parent run, if a stage created one (Snakefile onsuccess/onerror),
    and any child a killed rule left RUNNING."""
    pipeline_id = os.environ.get(PIPELINE_ENV)
    results_dir = Path(results_dir)
    marker = results_dir / ".pipelines" / f"{pipeline_id}.json"
    if not (enabled() and pipeline_id and marker.is_file()):
        return
    _close(results_dir, marker, status, "FAILED")


def close_abandoned_pipelines(results_dir: str | Path, current: str | None) -> list[str]:
    """Parent runs (and RUNNING children) of invocations that were killed before they could
    close them: marked KILLED when the next pipeline starts. Returns their run ids."""
    results_dir = Path(results_dir)
    markers = [m for m in sorted((results_dir / ".pipelines").glob("*.json")) if m.stem != current]
    if not (enabled() and markers):
        return []
    return [_close(results_dir, m, "KILLED", "KILLED") for m in markers]


def _close(results_dir: Path, marker: Path, status: str, children_status: str) -> str:
    from mlflow.tracking import MlflowClient

    from ratchet.tracking_store import close_running_children

    run_id = json.loads(marker.read_text())["run_id"]
    with store_lock(results_dir):
        client = MlflowClient(tracking_uri(results_dir))
        close_running_children(client, run_id, children_status)
        client.set_terminated(run_id, status)
    marker.unlink()
    return run_id
