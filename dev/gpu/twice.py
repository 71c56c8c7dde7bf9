"""Two uninterrupted trainings with the SIGKILL test's settings, side by side in their weights and
traces: if they differ, a resumed run cannot match either, and the cause is run-to-run, not the
resume. `python -m dev.gpu.twice --mode split,colocated --out DIR [overrides...]` (the local profile)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from ratchet import config as config_mod
from ratchet.stages import run_stage

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = (
    "train.steps=8",
    "train.checkpoint_every=2",
    "train.eval_every=0",
    "train.compute_dtype=bf16",
    "train.keep_checkpoints=1",
)


def first_difference(a: pd.DataFrame, b: pd.DataFrame) -> str:
    for (_, x), (_, y) in zip(a.iterrows(), b.iterrows()):
        differ = [c for c in b.columns if c in x and x[c] != y[c]]
        if differ:
            return f"part at step {y['step']}: {', '.join(differ)}"
    return "agree on every step" if len(a) == len(b) else "lengths differ"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="split")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", type=Path, default=ROOT / "config" / "local.yaml")
    parser.add_argument("overrides", nargs="*", default=list(DEFAULTS))
    args = parser.parse_args()
    os.environ["RATCHET_TRACKING"] = "off"
    first = args.out / "a"
    cfg = config_mod.load(args.profile, [f"results_dir={first}", *args.overrides])
    for stage in ("download_model", "download_data", "convert_weights", "build_engine"):
        run_stage(stage, cfg)
    second = args.out / "b"
    shutil.copytree(first, second, symlinks=True)
    failed = 0
    for mode in args.mode.split(","):
        runs = []
        for results in (first, second):
            cmd = [
                sys.executable,
                "-m",
                "ratchet",
                f"train_{mode}",
                f"results_dir={results}",
                *args.overrides,
                "--config",
                str(args.profile),
            ]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            run_dir = results / cfg["run_name"] / "train" / mode
            runs.append(
                (
                    json.loads((run_dir / "summary.json").read_text()),
                    pd.read_parquet(run_dir / "trace.parquet"),
                )
            )
        (sa, ta), (sb, tb) = runs
        same = sa["weights_sha256"] == sb["weights_sha256"]
        failed += not same
        print(
            f"[twice] {mode}: weights {'identical' if same else 'DIFFER'}; traces {first_difference(ta, tb)}",
            flush=True,
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
