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
from ratchet.stages.verify import trace_divergence

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = ("train.steps=8", "train.checkpoint_every=2", "train.eval_every=0", "train.compute_dtype=bf16",
            "train.keep_checkpoints=1")


def prepare(profile: Path, results: Path, overrides) -> dict:
    """The profile's stages before training under `results`, tracking off; its config."""
    os.environ["RATCHET_TRACKING"] = "off"
    cfg = config_mod.load(profile, [f"results_dir={results}", *overrides])
    for stage in ("download_model", "download_data", "convert_weights", "build_engine"):
        run_stage(stage, cfg)
    return cfg


def train_cli(mode: str, results: Path, overrides, profile: Path) -> list[str]:
    """`python -m ratchet train_<mode>` with these settings (overrides before --config)."""
    return [sys.executable, "-m", "ratchet", f"train_{mode}", f"results_dir={results}", *overrides,
            "--config", str(profile)]


def outputs(run_dir: Path) -> tuple[dict, pd.DataFrame]:
    """A finished training's summary and trace."""
    return json.loads((run_dir / "summary.json").read_text()), pd.read_parquet(run_dir / "trace.parquet")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="split")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", type=Path, default=ROOT / "config" / "local.yaml")
    parser.add_argument("overrides", nargs="*", default=list(DEFAULTS))
    args = parser.parse_args()
    first, second = args.out / "a", args.out / "b"
    cfg = prepare(args.profile, first, args.overrides)
    shutil.copytree(first, second, symlinks=True)
    failed = 0
    for mode in args.mode.split(","):
        runs = []
        for results in (first, second):
            subprocess.run(train_cli(mode, results, args.overrides, args.profile), check=True,
                           stdout=subprocess.DEVNULL)
            runs.append(outputs(results / cfg["run_name"] / "train" / mode))
        (sa, ta), (sb, tb) = runs
        same = sa["weights_sha256"] == sb["weights_sha256"]
        failed += not same
        print(f"[twice] {mode}: weights {'identical' if same else 'DIFFER'}; {trace_divergence(tb, ta)}",
              flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
