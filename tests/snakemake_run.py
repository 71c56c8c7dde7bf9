"""The project's Snakefile run in a subprocess as a user runs it: by default tracking off, with
none of an enclosing pipeline's environment (its config and parent run) leaking into it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_env(**extra: str) -> dict:
    """This process's environment without any RATCHET_ or MLFLOW_ variable (an enclosing run's
    config, parent run, tracking store), and `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "MLFLOW_"))}
    return {**env, **extra}


def snakemake_command(workdir: Path, *args: str, cores: str = "1") -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
            "--directory", str(workdir), "--cores", cores, *args]


def pipeline_env(tracking: str = "off") -> dict:
    """This process's environment for a pipeline of its own: without an enclosing pipeline's
    config, id and tracking store, RATCHET_TRACKING `tracking`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "RATCHET_PIPELINE_ID", "RATCHET_CONFIG_JSON")}
    return {**env, "RATCHET_TRACKING": tracking}


def run_snakemake(workdir: Path, *args: str, cores: str = "1", env: dict | None = None,
                  timeout: float = 600) -> subprocess.CompletedProcess:
    """`env`: the subprocess's whole environment; by default pipeline_env(), tracking off."""
    env = pipeline_env() if env is None else env
    return subprocess.run(snakemake_command(workdir, *args, cores=cores), capture_output=True, text=True,
                          env=env, timeout=timeout)
