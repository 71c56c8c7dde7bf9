"""A stage's MLflow writes, in a process of its own. Importing MLflow and opening its store
cost a stage's process seconds of single-threaded Python before any work (more than some
stages' whole work); this process pays them on another core while the stage runs.

tracking.StageRun sends it one JSON object per line on stdin and reads the run ids it makes
from a pipe: `python -m ratchet.tracking_worker REPLY_FD`; or, in a pipeline, the same over a
socket to a worker that tracking_forkserver forked with MLflow already imported. Every write to the store still goes
through the results directory's lock. A stage killed before it says "close" leaves its runs
RUNNING, as a killed process always did: the next pipeline marks them KILLED."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from ratchet.tracking import (
    EXPERIMENT_KIND,
    HTTP_LIMITS,
    code_version,
    device_name,
    flatten,
    package_versions,
    store_lock,
    tracking_uri,
)


class Recorder:
    """One stage's runs in the store: its own (named "") and one per variant."""

    def __init__(self, stage: str, cfg: dict, pipeline_id: str | None, pid: int | None = None):
        from mlflow.tracking import MlflowClient

        for key, value in HTTP_LIMITS.items():
            os.environ.setdefault(key, value)
        self.stage, self.cfg, self.pipeline_id = stage, cfg, pipeline_id
        self.results_dir = Path(cfg["results_dir"])
        self.max_artifact_bytes = cfg["tracking"]["max_artifact_mb"] * 2**20
        self.runs: dict[str, str] = {}
        with store_lock(self.results_dir):
            self.client = MlflowClient(tracking_uri(self.results_dir))
            self.experiment_id = self._experiment_id()
            tags = {"ratchet.stage": stage, "ratchet.run_name": cfg["run_name"],
                    "device": device_name(), **code_version(), **package_versions()}
            parent = self._parent_run()
            if parent:
                tags["mlflow.parentRunId"] = parent
            run = self.client.create_run(self.experiment_id, tags=tags,
                                         run_name=f"{cfg['run_name']}/{stage}")
            self.runs[""] = run.info.run_id
            self.log_batch("", params=flatten(cfg))
        self.hand_marker = None
        if not pipeline_id:  # a stage run by hand: killed, its runs would stay RUNNING with no
            # pipeline run to find them by; the next pipeline start closes them (tracking.py)
            self.hand_marker = self.results_dir / ".pipelines" / f"hand-{run.info.run_id}.json"
            self.hand_marker.parent.mkdir(parents=True, exist_ok=True)
            self.hand_marker.write_text(json.dumps({"run_id": run.info.run_id, "host": socket.gethostname(),
                                                    "pid": pid}))

    def child(self, name: str, params: dict[str, str]) -> str:
        """A run nested under the stage's for one variant (MLflow's compare view sets them side
        by side under shared metric names)."""
        tags = {"mlflow.parentRunId": self.runs[""], "ratchet.stage": self.stage, "ratchet.variant": name,
                "ratchet.run_name": self.cfg["run_name"]}
        with store_lock(self.results_dir):
            run = self.client.create_run(self.experiment_id, tags=tags,
                                         run_name=f"{self.cfg['run_name']}/{self.stage}/{name}")
        self.runs[name] = run.info.run_id
        self.log_batch(name, params={"variant": name, **params})
        return run.info.run_id

    def log_batch(self, name: str, metrics=(), params=None, tags=None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        with store_lock(self.results_dir):
            self.client.log_batch(
                self.runs[name], metrics=[Metric(k, v, ts, step) for k, v, ts, step in metrics],
                params=[Param(k, v[:6000]) for k, v in (params or {}).items()],
                tags=[RunTag(k, v[:5000]) for k, v in (tags or {}).items()])

    def log_output(self, name: str, path: str, artifact_name: str) -> None:
        """Copy an output (a file or a directory) as an artifact if small enough."""
        path = Path(path)
        size = path.stat().st_size if path.is_file() else sum(
            p.stat().st_size for p in path.rglob("*") if p.is_file())
        if size > self.max_artifact_bytes:
            return
        if path.is_file():
            self.client.log_artifact(self.runs[name], str(path))
        else:
            self.client.log_artifacts(self.runs[name], str(path), artifact_path=artifact_name)

    def close(self, status: str) -> None:
        """The variants' runs, then the stage's, ended with `status`."""
        for name in [n for n in self.runs if n] + [""]:
            with store_lock(self.results_dir):
                self.client.set_terminated(self.runs[name], status)
        if self.hand_marker is not None:
            self.hand_marker.unlink(missing_ok=True)

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

    def _parent_run(self) -> str | None:
        """The pipeline invocation's run: made by its first stage, found by the others."""
        if not self.pipeline_id:
            return None
        marker = self.results_dir / ".pipelines" / f"{self.pipeline_id}.json"
        if marker.is_file():
            return json.loads(marker.read_text())["run_id"]
        tags = {"ratchet.pipeline_id": self.pipeline_id, "ratchet.run_name": self.cfg["run_name"],
                "device": device_name(), **code_version()}
        run = self.client.create_run(self.experiment_id, tags=tags,
                                     run_name=f"{self.cfg['run_name']}/pipeline")
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"run_id": run.info.run_id}))
        return run.info.run_id


def serve(lines, reply) -> None:
    """Apply the stage's messages in order; the run ids it made go to `reply` as they are made."""
    recorder = None
    for line in lines:
        msg = json.loads(line)
        op = msg.pop("op")
        if op == "open":
            recorder = Recorder(msg["stage"], msg["cfg"], msg["pipeline_id"], msg.get("pid"))
            reply.write(json.dumps({"name": "", "run_id": recorder.runs[""]}) + "\n")
            print(f"[tracking] MLflow run {recorder.runs['']} ({msg['stage']}) at "
                  f"{tracking_uri(recorder.results_dir)}", flush=True)
        elif op == "child":
            run_id = recorder.child(msg["name"], msg["params"])
            reply.write(json.dumps({"name": msg["name"], "run_id": run_id}) + "\n")
        elif op == "batch":
            recorder.log_batch(msg["name"], metrics=msg.get("metrics", ()), tags=msg.get("tags"))
        elif op == "output":
            recorder.log_output(msg["name"], msg["path"], msg["artifact"])
        elif op == "close":
            recorder.close(msg["status"])
        else:
            raise ValueError(f"tracking worker: unknown message {op!r}")
        reply.flush()


def describe(error: BaseException) -> str:
    """One line for the user: the error, and the first cause beneath it that says what went
    wrong (MLflow wraps SQLAlchemy, which wraps sqlite3's "attempt to write a readonly
    database" or "database or disk is full" under a first line of its own boilerplate)."""
    def line(e):
        text = str(e).strip()
        return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"

    root = error
    for _ in range(7):  # a chain, not a loop: bounded all the same
        beneath = getattr(root, "orig", None) or root.__cause__ or root.__context__
        if beneath is None:
            break
        root = beneath
    return line(error) if root is error else f"{line(error)} (cause: {line(root)})"


def work(lines, reply) -> int:
    """serve(), then a last line: "done", or the error that stopped it (the stage raises it as
    one line, after its own work). The exit status. A stage that is gone (killed) has no one
    to tell: its broken pipe ends the worker quietly, not with a traceback in the stage's log."""
    try:
        serve(lines, reply)
        message, status = {"done": True}, 0
    except BrokenPipeError:  # the stage is gone
        return 1
    except Exception as e:  # noqa: BLE001
        message, status = {"error": describe(e)}, 1
    try:
        reply.write(json.dumps(message) + "\n")
        reply.flush()
    except (BrokenPipeError, ConnectionResetError):
        return 1
    return status


def main(argv: list[str]) -> int:
    return work(sys.stdin, os.fdopen(int(argv[0]), "w"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
