"""Two grid conditions of one study side by side: the source as converted (a GGUF file
dequantised: off the bf16 grid) and the source snapped to the bf16 grid before conversion
(`convert.snap_to: bf16`, the condition of weights released as bf16 values), each run's
ablate_decompose outputs read into one JSON record beside the seed study's figures, which are
quoted, not measured.

    python -m dev.grid_conditions --run results/local --run results/local-bf16grid \
        --out grid-conditions.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from ratchet.atomic import write_json
from ratchet.paths import RunPaths

VISIBILITY_AT = (1, 3, 10, 30)  # updates at which the visibility is quoted
GAP_SOURCES = ("total", "weight_rounding", "engine_kernels")

# Quoted from the literature (through issue 21): NOT measured by ratchet, never to be shown as such.
SEED_REFERENCE = {
    "label": "quoted from the literature, not measured by ratchet",
    "condition": "weights released as bf16 values (on the bf16 grid at update 0)",
    "seed_study": {
        "what": "share of weights whose bf16 value an update changes (the study ratchet reproduces)",
        "bf16_changed_share": {"1": 0.017, "30": 0.007},
        "as_quoted": "1.7% at update 1, falling to 0.7% by update 30",
    },
    "pulse": {
        "what": "share of bf16 updates invisible to the engine",
        "bf16_invisible_share": 0.99,
        "as_quoted": "~99% of bf16 updates invisible",
    },
}


def _by_update(frame: pd.DataFrame, column: str, value: str, at) -> dict[str, float | None]:
    """{update: the column's value} at each of `at` (None where the run has no such row)."""
    out = {}
    for u in at:
        rows = frame.loc[frame[column] == u, value]
        out[str(u)] = float(rows.iloc[0]) if len(rows) else None
    return out


def visibility(vis: pd.DataFrame) -> dict:
    """Per engine dtype: the share of weights whose value each update changes, of masters it
    moves, and of masters off the grid (update 0 included: the converted weights)."""
    out = {}
    for dtype, rows in vis.groupby("dtype", sort=False):
        out[dtype] = {"changed_share": _by_update(rows, "update", "changed_share", VISIBILITY_AT),
                      "moved_share": _by_update(rows, "update", "moved_share", VISIBILITY_AT),
                      "off_grid_share": _by_update(rows, "update", "off_grid_share", (0, *VISIBILITY_AT))}
    return out


def decomposition(frame: pd.DataFrame) -> dict:
    """Per engine dtype and source: the max and mean |difference of log p| at each update count."""
    out: dict = {}
    for (dtype, source), rows in frame.groupby(["engine_dtype", "source"], sort=False):
        if source not in GAP_SOURCES:
            continue
        out.setdefault(dtype, {})[source] = {
            str(int(r.updates)): {"max": float(r.abs_diff_max), "mean": float(r.abs_diff_mean)}
            for r in rows.sort_values("updates").itertuples()}
    return out


def condition(run: Path) -> dict:
    """One run's condition: how its weights were converted, and what its ablation measured."""
    paths = RunPaths(run.parent, run.name)
    for table in (paths.decompose_table, paths.visibility_table):
        if not table.is_file():
            raise SystemExit(f"{run}: missing {table} (run `snakemake ablate_decompose` for it)")
    manifest = json.loads(paths.manifest.read_text()) if paths.manifest.is_file() else {}
    return {"run": str(run), "engine_file_dtype": manifest.get("dtype"),
            "snap_to": manifest.get("snap_to"),
            "snap_changed_by_storage": manifest.get("snap_changed_by_storage"),
            "visibility": visibility(pd.read_parquet(paths.visibility_table)),
            "decomposition": decomposition(pd.read_parquet(paths.decompose_table))}


def compare(runs: list[Path]) -> dict:
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise SystemExit(f"--run: two runs share a name ({names}); each condition is named by its folder")
    return {"conditions": {run.name: condition(run) for run in runs}, "seed_reference": SEED_REFERENCE}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, action="append", required=True,
                        help="a run folder with ablate/decompose.parquet (give one per condition)")
    parser.add_argument("--out", type=Path, default=None, help="the JSON record to write (else stdout)")
    args = parser.parse_args(argv)
    record = compare(args.run)
    if args.out is None:
        print(json.dumps(record, indent=2))
    else:
        write_json(args.out, record)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
