"""The vLLM issue's record from what the GPU calls brought back (dev/gpu/vllm.sh): the
side-by-side bench (one run, or a later run's sections over it, named), the decomposition
table on both engines as a readable table, and the GPU tests' verdicts. `--over` starts from an
earlier record (a later session's sections laid over it, each named with its commit);
`--decompose-log` keeps the rows a decomposition printed before it stopped short of its table.

    python -m dev.vllm_record --bench h200-vllm.json --sections-from update=h200-vllm-update.json \\
        --decompose decompose_vllm.parquet --pytest pytest-vllm-gpu.txt --out results/records/h200-vllm.json
    python -m dev.vllm_record --over results/records/h200-vllm.json --commit C \\
        --sections-from eval=eval.json --sections-from sensitivity_vllm_batch_invariant=bi.json:sensitivity \\
        --decompose-log decompose_vllm.txt --out results/records/h200-vllm.json"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd

from ratchet.atomic import write_json
from ratchet.bench.vs_vllm import headline


def decomposition(path: Path) -> list[dict]:
    """Rows of (backend, engine dtype, updates, source) with the mean, p99 and max gap."""
    frame = pd.read_parquet(path)
    keep = ["backend", "engine_dtype", "updates", "source", "abs_diff_mean", "abs_diff_p99", "abs_diff_max",
            "kl_k3", "num_tokens"]
    return frame[keep].to_dict("records")


# a row the stage prints: "[ablate_decompose_vllm]  10 updates  vllm  bf16 total   mean 1.49e-02  max 6.71e-01"
ROW = re.compile(r"^\[ablate_decompose_vllm\]\s+(\d+) updates\s+(\w+)\s+(\w+)\s+(\w+)\s+"
                 r"mean ([-+.\deE]+)\s+max ([-+.\deE]+)\s*$", re.MULTILINE)
PLANNED = re.compile(r"^\[ablate_decompose_vllm\] \d+/(\d+) updates", re.MULTILINE)


def decomposition_from_log(path: Path) -> dict:
    """The rows a decomposition printed (mean and max only), and whether it reached its last
    update count: for a run stopped before it wrote its table, never to pass for a whole one."""
    return decomposition_from_log_text(path.read_text(), path.name)


def decomposition_from_log_text(text: str, name: str) -> dict:
    rows = [{"updates": int(u), "backend": b, "engine_dtype": d, "source": src, "abs_diff_mean": float(mean),
             "abs_diff_max": float(mx)} for u, b, d, src, mean, mx in ROW.findall(text)]
    planned = max((int(n) for n in PLANNED.findall(text)), default=None)
    measured = sorted({r["updates"] for r in rows})
    return {"log": name, "planned_updates": planned, "updates_measured": measured,
            "complete": planned is not None and bool(measured) and measured[-1] >= planned, "rows": rows}


def merge_decomposition(old: list[dict], new: list[dict]) -> list[dict]:
    """`old`'s rows with those of every engine dtype `new` measures replaced by `new`'s (a later
    session's bf16 table beside an earlier fp16 one)."""
    dtypes = {r["engine_dtype"] for r in new}
    return [r for r in old if r["engine_dtype"] not in dtypes] + new


def take_section(bench: dict, item: str, commit: str | None) -> tuple[str, str]:
    """NAME=FILE[:SECTION]: FILE's SECTION (default NAME) stored in the bench as NAME."""
    name, source = item.split("=", 1)
    path, _, section = source.partition(":")
    bench[name] = json.loads(Path(path).read_text())[section or name]
    where = f"{Path(path).name}" + (f", its {section} section" if section else "")
    return name, f"a later run of the bench ({where}" + (f", commit {commit[:7]})" if commit else ")")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", help="the bench's JSON (or --over)")
    ap.add_argument("--over", help="an earlier record to start from: its bench, tables and tests kept")
    ap.add_argument("--sections-from", action="append", default=[], metavar="NAME=FILE[:SECTION]",
                    help="a section taken from a later run of the bench (a fix rerun alone), stored as NAME")
    ap.add_argument("--decompose", action="append", default=[],
                    help="a decomposition table; with --over its engine dtypes replace the earlier rows")
    ap.add_argument("--decompose-log", help="a decomposition's printed rows, for a run stopped before its table")
    ap.add_argument("--pytest")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--command", action="append", default=[])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if bool(args.bench) == bool(args.over):
        ap.error("give one of --bench or --over")
    if args.over:
        record = json.loads(Path(args.over).read_text())
        record["commands"] = record.get("commands", []) + args.command
        record.setdefault("later_commits", []).append(args.commit)
        bench, sources = record["bench"], record.setdefault("sections_from_other_runs", {})
    else:
        bench, sources = json.loads(Path(args.bench).read_text()), {}
        record = {"machine": bench.get("device"), "commit": args.commit, "commands": args.command,
                  "bench": bench, "sections_from_other_runs": sources}
    for item in args.sections_from:
        name, where = take_section(bench, item, args.commit if args.over else None)
        sources[name] = where
    bench["headline"] = headline(bench)
    if args.decompose_log:
        record["decompose_vllm_from_log"] = decomposition_from_log(Path(args.decompose_log))
    for path in args.decompose:
        rows = decomposition(Path(path))
        record["decompose_vllm"] = merge_decomposition(record.get("decompose_vllm", []), rows)
        cut = record.get("decompose_vllm_from_log")
        if cut and {r["engine_dtype"] for r in cut["rows"]} <= {r["engine_dtype"] for r in rows}:
            del record["decompose_vllm_from_log"]  # a whole table of the same dtypes supersedes it
    if args.pytest:
        text = Path(args.pytest).read_text()
        record["gpu_tests"] = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED) (\S+)", text, re.MULTILINE)
        record["gpu_tests_summary"] = (re.findall(r"^\d+ passed.*$", text, re.MULTILINE) or [""])[-1]
    write_json(Path(args.out), record)
    print(json.dumps(bench["headline"], indent=1))


if __name__ == "__main__":
    main()
