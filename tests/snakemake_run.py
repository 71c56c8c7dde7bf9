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


def run_snakemake(workdir: Path, *args: str, cores: str = "1", env: dict | None = None,
                  timeout: float = 600) -> subprocess.CompletedProcess:
    """`env`: the subprocess's whole environment; by default this one's, tracking off, without
    an enclosing pipeline's config and id."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in ("RATCHET_CONFIG_JSON", "RATCHET_PIPELINE_ID")}
        env["RATCHET_TRACKING"] = "off"
    return subprocess.run(snakemake_command(workdir, *args, cores=cores), capture_output=True, text=True,
                          env=env, timeout=timeout)
