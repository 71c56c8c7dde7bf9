"""The MLflow store's health, checked once up front, and runs a killed process left RUNNING.

MLflow's own client retries a dead server for minutes and answers a corrupt SQLite file with
a long SQLAlchemy traceback; a pipeline should instead stop at once with one line naming
the store and the way out (`RATCHET_TRACKING=off`).
"""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ratchet.errors import InputError

OFF_HINT = "run without tracking: RATCHET_TRACKING=off"


class TrackingStoreError(InputError, RuntimeError):
    """The tracking store cannot be used; the message is one line for the user."""


def check_store(uri: str, timeout_s: float = 10.0) -> None:
    """Raise TrackingStoreError unless `uri` (sqlite:/// or http(s)://) answers within timeout_s."""
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme == "sqlite":
        _check_sqlite(Path(uri[len("sqlite:///"):]), uri, timeout_s)
    elif scheme in ("http", "https"):
        _check_server(uri, timeout_s)
    # other stores (file:, databricks, ...) are left to MLflow


def _check_sqlite(path: Path, uri: str, timeout_s: float) -> None:
    for module in ("sqlalchemy", "alembic"):  # MLflow's SQL store imports them only when first used,
        try:                                  # in every job: mlflow-skinny alone lacks them
            importlib.import_module(module)
        except ImportError as e:
            raise TrackingStoreError(f"MLflow store {uri} needs the {module} package, which this Python "
                                     f"lacks ({e}): pip install sqlalchemy alembic (or the full mlflow), "
                                     f"or {OFF_HINT}") from None
    # SQLite writes a journal beside the file: a read-only file or folder fails only at the
    # stage's first write, after its work, in words of SQLAlchemy's that do not say why
    for needed in ([path] if path.exists() else []) + [path.parent]:
        if needed.exists() and not os.access(needed, os.W_OK):
            raise TrackingStoreError(f"MLflow store {uri}: {needed} is not writable here; "
                                     f"make it so, point MLFLOW_TRACKING_URI elsewhere, or {OFF_HINT}")
    if not path.exists():
        return  # MLflow creates it
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout_s) as db:
            db.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error as e:
        raise TrackingStoreError(f"MLflow store {uri} is not a usable SQLite database ({e}); "
                                 f"move it aside, or {OFF_HINT}") from None


def _check_server(uri: str, timeout_s: float) -> None:
    url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        raise TrackingStoreError(f"MLflow server {uri} answered HTTP {e.code}; {OFF_HINT}") from None
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise TrackingStoreError(f"MLflow server {uri} cannot be reached within {timeout_s:.0f} s "
                                 f"({reason}); {OFF_HINT}") from None


def close_running_children(client, parent_run_id: str, status: str) -> list[str]:
    """Mark the RUNNING descendants of a pipeline run `status` (a rule killed mid-run never closes
    its own run, nor the variant runs under it); returns their ids."""
    experiment = client.get_run(parent_run_id).info.experiment_id
    closed, parents = [], [parent_run_id]
    while parents:  # a finished run closed its own variants: only RUNNING ones are searched under
        runs = [run for parent in parents
                for run in client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{parent}' "
                                                                          "and attributes.status = 'RUNNING'")]
        for run in runs:
            client.set_terminated(run.info.run_id, status)
        closed += [run.info.run_id for run in runs]
        parents = [run.info.run_id for run in runs]
    return closed
