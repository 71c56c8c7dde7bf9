"""convert_weights runs alone on the critical path and Snakemake sets OMP_NUM_THREADS to a
rule's threads (1 unless stated): it asks for every core but one, and one where there is one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from snakemake_run import run_snakemake


def _dry_run_threads(workdir: Path, cores: str) -> int:
    proc = run_snakemake(workdir, "-n", "--", "convert_weights", cores=cores)
    assert proc.returncode == 0, proc.stderr[-2000:]
    job = (proc.stdout + proc.stderr).split("rule convert_weights:", 1)[1].split("\n\n", 1)[0]
    found = re.search(r"threads: (\d+)", job)
    return int(found.group(1)) if found else 1


@pytest.mark.parametrize(("cores", "threads"), [("5", 4), ("2", 1), ("1", 1)])
def test_convert_weights_takes_every_core_but_one(tmp_path, cores, threads):
    assert _dry_run_threads(tmp_path, cores) == threads
