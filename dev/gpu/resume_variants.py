"""The split training resumed from one checkpoint under several environments, each trace beside
the uninterrupted run's: which setting makes a GPU resume match (a race on the GPU shows as a
resume that matches only when launches are serialised). Deterministic, no kill: the run keeps its
checkpoint of step 4 and is rerun from it.
`python -m dev.gpu.resume_variants --out DIR` (the local profile, the SIGKILL test's settings)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from dev.gpu.twice import first_difference
from ratchet import config as config_mod
from ratchet.paths import RunPaths
from ratchet.stages import run_stage

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = (
    "train.steps=8",
    "train.checkpoint_every=4",
    "train.eval_every=0",
    "train.compute_dtype=bf16",
    "train.keep_checkpoints=2",
)
VARIANTS = {
    "plain": {},
    "launch_blocking": {"CUDA_LAUNCH_BLOCKING": "1"},
    "no_stream_priority": {"RATCHET_STREAM_PRIORITY": "0"},
    "no_pdl": {"RATCHET_PDL": "0"},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mode", default="split")
    parser.add_argument("--profile", type=Path, default=ROOT / "config" / "local.yaml")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    os.environ["RATCHET_TRACKING"] = "off"
    cfg = config_mod.load(args.profile, [f"results_dir={args.out}", *OVERRIDES])
    for stage in ("download_model", "download_data", "convert_weights", "build_engine"):
        run_stage(stage, cfg)
    paths = RunPaths.from_config(cfg)
    run_dir, ckpts = (
        Path(paths.train_dir(args.mode)),
        Path(paths.checkpoints(args.mode)),
    )
    cli = [
        sys.executable,
        "-m",
        "ratchet",
        f"train_{args.mode}",
        f"results_dir={args.out}",
        *OVERRIDES,
        "--config",
        str(args.profile),
    ]

    def run(env: dict) -> tuple[dict, pd.DataFrame, str]:
        done = subprocess.run(
            cli, check=False, env={**os.environ, **env}, capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(done.stdout[-2000:] + done.stderr[-3000:])
        resumed = [line for line in done.stdout.splitlines() if "resumed from" in line]
        return (
            json.loads((run_dir / "summary.json").read_text()),
            pd.read_parquet(run_dir / "trace.parquet"),
            resumed[0] if resumed else "not resumed",
        )

    full, full_trace, _ = run({})
    keep = args.out / "step-000004"
    shutil.copytree(ckpts / "step-000004", keep)
    print(f"[variants] uninterrupted: {full['weights_sha256'][:16]}", flush=True)
    for name in args.variants.split(","):
        env = {} if name.startswith("full_") else VARIANTS[name]
        shutil.rmtree(run_dir)
        if name.startswith(
            "full_"
        ):  # an uninterrupted run under the named variant's environment
            env = VARIANTS[name.removeprefix("full_")]
        else:
            shutil.copytree(keep, ckpts / "step-000004")
        summary, trace, resumed = run(env)
        same = summary["weights_sha256"] == full["weights_sha256"]
        print(
            f"[variants] {name}: {'SAME' if same else 'DIFFERENT'} weights; traces "
            f"{first_difference(trace, full_trace)}; {resumed.strip()}",
            flush=True,
        )


if __name__ == "__main__":
    main()
