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
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from ratchet.tracking_outbox import Outbox

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
    """Context manager around one stage: params, tags, metrics with steps, outputs. The writes
    go to a tracking_worker process started on entry, which imports MLflow and opens the store
    while the stage works; exit waits for it to finish them (WORKER_WAIT_S at most)."""

    def __init__(self, stage: str, cfg: dict, _worker: "_Worker | None" = None, _name: str = ""):
        self.stage = stage
        self.cfg = cfg
        self.results_dir = Path(cfg["results_dir"])
        self._worker = _worker
        self._name = _name  # "" the stage's own run, else a variant's
        self._children: dict[str, StageRun] = {}

    @property
    def run_id(self) -> str | None:
        """The run's MLflow id (waits for the worker to make it); None without tracking."""
        return self._worker.run_id(self._name) if self._worker is not None else None

    # -- lifecycle --------------------------------------------------------------------
    def __enter__(self) -> "StageRun":
        if not enabled():
            return self
        self._worker = _Worker()
        self._worker.send({"op": "open", "stage": self.stage, "cfg": self.cfg,
                           "pipeline_id": os.environ.get(PIPELINE_ENV), "pid": os.getpid()})
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._worker is None:
            return
        self._worker.send({"op": "close", "status": "FAILED" if exc_type else "FINISHED"})
        failure = self._worker.finish()
        if failure and exc_type is None:  # a failed stage's own error says more
            from ratchet.tracking_store import TrackingStoreError

            raise TrackingStoreError(f"MLflow tracking of {self.stage} failed: {failure}; "
                                     "run without tracking: RATCHET_TRACKING=off")

    def variant(self, name: str, params: dict | None = None) -> "StageRun":
        """A run nested under this one for one variant of the stage (an ablation run, a source
        of the gap): MLflow's compare view then sets variants side by side under shared
        metric names. Created on first use, closed with this run."""
        child = self._children.get(name)
        if child is None:
            child = self._children[name] = StageRun(self.stage, self.cfg, self._worker, name)
            if self._worker is not None:
                self._worker.send({"op": "child", "name": name,
                                   "params": {k: str(v) for k, v in (params or {}).items()}})
        return child

    # -- logging ----------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        if self._worker is None:
            return
        now = int(time.time() * 1000)
        rows = [(k, float(v), now, int(step)) for k, v in metrics.items() if v is not None]
        for start in range(0, len(rows), 900):  # MLflow's log_batch takes 1,000 at most
            self._worker.send({"op": "batch", "name": self._name, "metrics": rows[start:start + 900]})

    def set_tags(self, tags: dict[str, str]) -> None:
        if self._worker is not None:
            self._worker.send({"op": "batch", "name": self._name, "tags": {k: str(v) for k, v in tags.items()}})

    def log_output(self, path: Path, name: str | None = None) -> str:
        """Record an output's SHA-256 as a tag, and copy it as an artifact if small enough."""
        path = Path(path)
        digest = sha256_of(path)
        if self._worker is None:
            return digest
        name = name or path.name
        self.set_tags({f"sha256.{name}": digest})
        self._worker.send({"op": "output", "name": self._name, "path": str(path.resolve()), "artifact": name})
        return digest


WORKER_WAIT_S = 600  # a stage's last writes: SQLite takes well under a second, a dead server its retries


SOCKET_ENV = "RATCHET_TRACKING_SOCKET"  # the pipeline's tracking_forkserver, for its jobs


def forkserver_address(path: str) -> str:
    """The SOCKET_ENV value: the server's host and interpreter with its socket's path, so a
    stage on another host, or under another Python, does not use it."""
    return json.dumps({"host": socket.gethostname(), "python": _interpreter(), "path": path})


def _interpreter() -> str:
    """This Python and its environment (two virtualenvs may share one executable)."""
    return f"{os.path.realpath(sys.executable)}:{sys.prefix}"


def connect_forkserver() -> socket.socket | None:
    """A connection to this pipeline's server, handed this process's output, directory and
    environment; None where there is none to use."""
    try:
        where = json.loads(os.environ[SOCKET_ENV])
    except (KeyError, ValueError):
        return None
    if where.get("host") != socket.gethostname() or where.get("python") != _interpreter():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(where["path"])
        hello = json.dumps({"cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        socket.send_fds(sock, [len(hello).to_bytes(8, "little") + hello], [1, 2])
    except OSError:
        sock.close()
        return None
    return sock


class _Worker:
    """A stage's tracking worker: messages in, run ids back. Forked by the pipeline's
    tracking_forkserver where one serves this host (MLflow already imported), else a
    tracking_worker process of its own (messages on its stdin, replies on a pipe)."""

    def __init__(self):
        self.proc = None
        self.sock = connect_forkserver()
        if self.sock is not None:
            self.sock.settimeout(WORKER_WAIT_S)
            self.messages = self.sock.makefile("w")
            self.replies = self.sock.makefile("r")
        else:
            read_end, write_end = os.pipe()
            package_root = str(Path(__file__).resolve().parents[1])  # found from any working directory
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (os.environ.get("PYTHONPATH"), package_root) if p)}
            self.proc = subprocess.Popen([sys.executable, "-m", "ratchet.tracking_worker", str(write_end)],
                                         stdin=subprocess.PIPE, pass_fds=(write_end,), env=env, text=True)
            os.close(write_end)
            self.messages = self.proc.stdin
            self.replies = os.fdopen(read_end)
        self.outbox = Outbox(self.messages)  # a stalled store never blocks the stage's own work
        self.ids: dict[str, str] = {}
        self.error: str | None = None
        self.done = False

    def send(self, msg: dict) -> None:
        self.outbox.put(json.dumps(msg) + "\n")  # a worker that stopped: finish() reads why

    def run_id(self, name: str) -> str | None:
        while name not in self.ids and self._read_reply():
            pass
        return self.ids.get(name)

    def finish(self) -> str | None:
        """Wait for the worker to apply every message (WORKER_WAIT_S at most, all told); its
        error, or None."""
        deadline = time.monotonic() + WORKER_WAIT_S
        late = f"the store did not take the stage's writes within {WORKER_WAIT_S} s"
        if not self.outbox.close(WORKER_WAIT_S):
            self._stop()
            return late
        failure = self._finish_socket() if self.sock is not None else self._finish_process(deadline, late)
        if failure is None and self.outbox.dropped:
            failure = f"{self.outbox.dropped} messages were dropped: the store fell behind the stage"
        return failure

    def _stop(self) -> None:
        """End a worker that stopped reading (its blocked write then fails)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        else:
            with contextlib.suppress(OSError):
                self.sock.close()

    def _finish_process(self, deadline: float, late: str) -> str | None:
        try:
            code = self.proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self._stop()
            return late
        while self._read_reply():
            pass
        self.replies.close()
        if code:
            return self.error or f"its process exited with status {code}"
        return None

    def _finish_socket(self) -> str | None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)  # the worker reads to the end, then says done
        try:
            while self._read_reply():
                pass
        except TimeoutError:
            return f"the store did not take the stage's writes within {WORKER_WAIT_S} s"
        except OSError as e:
            return self.error or f"its connection failed: {e}"
        finally:
            self.replies.close()
            self.sock.close()
        return self.error or (None if self.done else "its worker ended before it was done")

    def _read_reply(self) -> bool:
        line = self.replies.readline()
        if not line:
            return False
        reply = json.loads(line)
        if "error" in reply:
            self.error = reply["error"]
        elif reply.get("done"):
            self.done = True
        else:
            self.ids[reply["name"]] = reply["run_id"]
        return True


def start_forkserver() -> None:
    """The pipeline's tracking_forkserver (Snakefile onstart), its address exported to the jobs;
    it ends with this process (its stdin is a pipe from here). RATCHET_TRACKING_FORKSERVER=off:
    none, each stage starts its own worker (where fork() is unsafe, or to compare)."""
    import tempfile

    if os.environ.get("RATCHET_TRACKING_FORKSERVER", "on").lower() in ("0", "off", "false", "no"):
        return

    path = os.path.join(tempfile.gettempdir(), f"ratchet-tracking-{os.getpid()}.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    package_root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), package_root) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "ratchet.tracking_forkserver", path], stdin=subprocess.PIPE,
                            env=env, cwd=os.getcwd())
    for _ in range(200):  # it binds before its imports: ~0.1 s
        if os.path.exists(path) or proc.poll() is not None:
            break
        time.sleep(0.01)
    if os.path.exists(path):
        os.environ[SOCKET_ENV] = forkserver_address(path)
        _forkserver.append(proc)  # its stdin stays open as long as this process lives


_forkserver: list = []


def import_sql_store() -> None:
    """Import MLflow's client and its SQL store (SQLAlchemy, alembic, the table models), which
    MlflowClient imports only when it first opens a sqlite:// or database store: two thirds of
    a forked tracking worker's start when each imported it again. Without SQLAlchemy (a store
    of another kind; check_store names what a sqlite:// one lacks) the client alone."""
    import mlflow.tracking  # noqa: F401

    try:
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    except ImportError:
        pass


def preload_mlflow() -> None:
    """import_sql_store on a daemon thread: for a process that will need MLflow later and
    idles until then (Snakemake's, which closes the parent run when the last job is done)."""
    import threading

    threading.Thread(target=import_sql_store, daemon=True).start()


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
    markers = [m for m in sorted((results_dir / ".pipelines").glob("*.json"))
               if m.stem != current and not _still_running(m)]
    if not (enabled() and markers):
        return []
    closed = []
    for marker in markers:
        try:
            closed.append(_close(results_dir, marker, "KILLED", "KILLED"))
        except Exception as e:  # a marker of a run this store does not hold (moved aside, another URI)
            gone = isinstance(e, (ValueError, KeyError)) or "RESOURCE_DOES_NOT_EXIST" in str(getattr(e, "error_code", ""))
            print(f"ratchet: tracking: the run of an earlier, killed pipeline ({marker.name}) could not be "
                  f"closed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                  f"{'; not in this store, its marker removed' if gone else ''}", file=sys.stderr)
            if gone:
                marker.unlink(missing_ok=True)
    return closed


def _still_running(marker: Path) -> bool:
    """A hand-run stage's marker whose process is alive on this host (its runs are not abandoned)."""
    try:
        info = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if not (isinstance(info, dict) and info.get("pid") and info.get("host") == socket.gethostname()):
        return False
    try:
        os.kill(int(info["pid"]), 0)
    except PermissionError:  # alive, under another user
        return True
    except (ProcessLookupError, ValueError, TypeError, OverflowError):
        return False
    return True


def _close(results_dir: Path, marker: Path, status: str, children_status: str) -> str:
    from mlflow.tracking import MlflowClient

    from ratchet.tracking_store import close_running_children

    run_id = json.loads(marker.read_text())["run_id"]  # ValueError / KeyError: a marker that is not one
    with store_lock(results_dir):
        client = MlflowClient(tracking_uri(results_dir))
        close_running_children(client, run_id, children_status)
        client.set_terminated(run_id, status)
    marker.unlink()
    return run_id
