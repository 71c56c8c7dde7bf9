"""The vLLM issue's record from what the GPU calls brought back (dev/gpu/vllm.sh): the
side-by-side bench (one run, or a later run's sections over it, named), the decomposition
table on both engines as a readable table, and the GPU tests' verdicts.

    python -m dev.vllm_record --bench h200-vllm.json --sections-from update=h200-vllm-update.json \\
        --decompose decompose_vllm.parquet --pytest pytest-vllm-gpu.txt --out results/records/h200-vllm.json"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd

from ratchet.bench.vs_vllm import headline


def decomposition(path: Path) -> list[dict]:
    """Rows of (backend, engine dtype, updates, source) with the mean, p99 and max gap."""
    frame = pd.read_parquet(path)
    keep = ["backend", "engine_dtype", "updates", "source", "abs_diff_mean", "abs_diff_p99", "abs_diff_max",
            "kl_k3", "num_tokens"]
    return frame[keep].to_dict("records")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True)
    ap.add_argument("--sections-from", action="append", default=[], metavar="SECTION=FILE",
                    help="a section taken from a later run of the bench (a fix rerun alone)")
    ap.add_argument("--decompose")
    ap.add_argument("--pytest")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--command", action="append", default=[])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    bench = json.loads(Path(args.bench).read_text())
    sources = {}
    for item in args.sections_from:
        section, path = item.split("=", 1)
        bench[section] = json.loads(Path(path).read_text())[section]
        sources[section] = f"a later run of the bench in the same session ({Path(path).name})"
    bench["headline"] = headline(bench)
    record = {"machine": bench.get("device"), "commit": args.commit, "commands": args.command,
              "bench": bench, "sections_from_other_runs": sources}
    if args.decompose:
        record["decompose_vllm"] = decomposition(Path(args.decompose))
    if args.pytest:
        text = Path(args.pytest).read_text()
        record["gpu_tests"] = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED) (\S+)", text, re.MULTILINE)
        record["gpu_tests_summary"] = (re.findall(r"^\d+ passed.*$", text, re.MULTILINE) or [""])[-1]
    Path(args.out).write_text(json.dumps(record, indent=1, default=float) + "\n")
    print(json.dumps(bench["headline"], indent=1))


if __name__ == "__main__":
    main()
