"""`gpu_memory_gib.<stage>=N` overrides from the peaks a pipeline run's logs end with (read as
dev.record reads them), for the next run's `--config set=...` (dev/gpu/local-pipeline.sh:
PIPELINE_SET). A peak is rounded up after a margin, since the same rule's peak moves with the
lengths its batches happen to have; a stage whose log has no peak line keeps the profile's figure.

    python3 -m dev.stated_from_peaks results/local/logs [--margin 0.08] [--extra-gib 1] [--per-job]

--per-job: also each job's own statement by its log's label (gpu_memory_gib.ablate_fix_run-exact),
where a stage ran several jobs, so that the smaller ones ask for less (the config takes them).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from dev.record import PEAK, logged_rules


def peaks(logs: Path) -> dict[str, float]:
    """stage -> the largest peak of its jobs (a job's log is labelled stage-value-...)."""
    found: dict[str, float] = {}
    for label, gib in logged_rules(logs, PEAK).items():
        stage = label.split("-")[0]
        found[stage] = max(found.get(stage, 0.0), gib)
    return found


def job_peaks(logs: Path) -> dict[str, float]:
    """label -> peak, for the jobs of stages that ran several (their labels hold a "-")."""
    return {label: gib for label, gib in logged_rules(logs, PEAK).items() if "-" in label}


def statements(found: dict[str, float], margin: float, extra_gib: float) -> list[str]:
    return [f"gpu_memory_gib.{stage}={math.ceil(gib * (1 + margin) + extra_gib)}"
            for stage, gib in sorted(found.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path)
    parser.add_argument("--margin", type=float, default=0.08)
    parser.add_argument("--extra-gib", type=float, default=1.0)
    parser.add_argument("--per-job", action="store_true", help="each job's own statement too")
    args = parser.parse_args(argv)
    if not args.logs.is_dir():
        print(f"stated_from_peaks: no folder {args.logs}", file=sys.stderr)
        return 2
    found = peaks(args.logs) | (job_peaks(args.logs) if args.per_job else {})
    print(" ".join(statements(found, args.margin, args.extra_gib)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
