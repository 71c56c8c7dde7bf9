"""`gpu_memory_gib.<stage>=N` overrides from the peaks a pipeline run's logs end with, for the
next run's `--config set=...` (dev/gpu/local-pipeline.sh: PIPELINE_SET). A peak is rounded up
after a margin, since the same rule's peak moves with the lengths its batches happen to have;
a stage whose log has no peak line keeps the profile's figure.

    python3 dev/gpu/stated_from_peaks.py results/local/logs [--margin 0.08] [--extra-gib 1]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

PEAK = re.compile(r"^\[([A-Za-z_]+)[^\]]*\] peak GPU memory ([0-9.]+) GiB", re.MULTILINE)


def peaks(logs: Path) -> dict[str, float]:
    """stage -> the largest peak any of its jobs' logs states."""
    found: dict[str, float] = {}
    for log in sorted(logs.glob("*.log")):
        for stage, gib in PEAK.findall(log.read_text(errors="replace")):
            found[stage] = max(found.get(stage, 0.0), float(gib))
    return found


def statements(found: dict[str, float], margin: float, extra_gib: float) -> list[str]:
    return [f"gpu_memory_gib.{stage}={math.ceil(gib * (1 + margin) + extra_gib)}"
            for stage, gib in sorted(found.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path)
    parser.add_argument("--margin", type=float, default=0.08)
    parser.add_argument("--extra-gib", type=float, default=1.0)
    args = parser.parse_args(argv)
    if not args.logs.is_dir():
        print(f"stated_from_peaks: no folder {args.logs}", file=sys.stderr)
        return 2
    print(" ".join(statements(peaks(args.logs), args.margin, args.extra_gib)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
