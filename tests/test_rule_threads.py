"""convert_weights runs alone on the critical path and Snakemake sets OMP_NUM_THREADS to a
rule's threads (1 unless stated): it asks for every core but one, and one where there is one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dry_run_threads(workdir: Path, cores: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("RATCHET_CONFIG_JSON", "RATCHET_PIPELINE_ID")}
    env["RATCHET_TRACKING"] = "off"
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
                           "--directory", str(workdir), "--cores", cores, "-n", "--", "convert_weights"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    job = (proc.stdout + proc.stderr).split("rule convert_weights:", 1)[1].split("\n\n", 1)[0]
    found = re.search(r"threads: (\d+)", job)
    return int(found.group(1)) if found else 1


@pytest.mark.parametrize(("cores", "threads"), [("5", 4), ("2", 1), ("1", 1)])
def test_convert_weights_takes_every_core_but_one(tmp_path, cores, threads):
    assert _dry_run_threads(tmp_path, cores) == threads
