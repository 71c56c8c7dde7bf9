"""dev/timeline.py: each job's start and end from a Snakemake log, wildcards named, a job that
never finished left open."""

from dev.timeline import jobs, table

LOG = """\
Building DAG of jobs...
[Fri Dec  4 16:23:59 2026]
localrule download_data:
    output: results/local/data/train.parquet
    jobid: 5
    resources: tmpdir=/tmp
[Fri Dec  4 16:24:05 2026]
Finished jobid: 5 (Rule: download_data)
1 of 4 steps (25%) done
Select jobs to execute...

[Fri Dec  4 16:27:36 2026]
localrule ablate_fix_run:
    log: results/local/logs/ablate_fix_run-fix.log
    jobid: 17
    wildcards: remedy=fix
    resources: tmpdir=/tmp, gpu_jobs=1, gpu_mem_gib=30
[Fri Dec  4 16:27:36 2026]
rule ablate_fix_run:
    jobid: 18
    wildcards: remedy=exact
[Fri Dec  4 16:28:55 2026]
Finished jobid: 17 (Rule: ablate_fix_run)
2 of 4 steps (50%) done
"""


def test_jobs_start_end_and_wildcards():
    found = jobs(LOG.splitlines(keepends=True))
    assert [(j.name, j.start, j.end) for j in found] == [
        ("download_data", 0.0, 6.0),
        ("ablate_fix_run (remedy=fix)", 217.0, 296.0),
        ("ablate_fix_run (remedy=exact)", 217.0, None),  # still running when the log ends
    ]
    text = table(found)
    assert "| ablate_fix_run (remedy=fix) | 217 | 296 | 79 |" in text
    assert "| ablate_fix_run (remedy=exact) | 217 | - | - |" in text
