"""The project's Snakefile run in a subprocess as a user runs it, tracking off, with none of an
enclosing pipeline's environment (its config and parent run) leaking into it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_snakemake(workdir: Path, *args: str, cores: str = "1") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RATCHET_CONFIG_JSON", "RATCHET_PIPELINE_ID")}
    env["RATCHET_TRACKING"] = "off"
    return subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
                           "--directory", str(workdir), "--cores", cores, *args],
                          capture_output=True, text=True, env=env, timeout=600)
