"""The split training resumed from one checkpoint under several environments, each trace beside
the uninterrupted run's: which setting makes a GPU resume match (a race on the GPU shows as a
resume that matches only when launches are serialised). Deterministic, no kill: the run keeps its
checkpoint of step 4 and is rerun from it; `full_<variant>` reruns the whole run instead.
`python -m dev.gpu.resume_variants --out DIR` (the local profile, the SIGKILL test's settings)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from dev.gpu.twice import ROOT, outputs, prepare, train_cli
from ratchet.paths import RunPaths
from ratchet.stages.verify import trace_divergence

OVERRIDES = ("train.steps=8", "train.checkpoint_every=4", "train.eval_every=0", "train.compute_dtype=bf16",
             "train.keep_checkpoints=2")
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
    paths = RunPaths.from_config(prepare(args.profile, args.out, OVERRIDES))
    run_dir, ckpts = Path(paths.train_dir(args.mode)), Path(paths.checkpoints(args.mode))
    cli = train_cli(args.mode, args.out, OVERRIDES, args.profile)

    def run(env: dict):
        done = subprocess.run(cli, check=False, env={**os.environ, **env}, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(done.stdout[-2000:] + done.stderr[-3000:])
        resumed = [line.strip() for line in done.stdout.splitlines() if "resumed from" in line]
        return (*outputs(run_dir), resumed[0] if resumed else "not resumed")

    full, full_trace, _ = run({})
    keep = args.out / "step-000004"
    shutil.copytree(ckpts / "step-000004", keep)
    print(f"[variants] uninterrupted: {full['weights_sha256'][:16]}", flush=True)
    for name in args.variants.split(","):
        shutil.rmtree(run_dir)
        if not name.startswith("full_"):
            shutil.copytree(keep, ckpts / "step-000004")
        summary, trace, resumed = run(VARIANTS[name.removeprefix("full_")])
        same = summary["weights_sha256"] == full["weights_sha256"]
        print(f"[variants] {name}: {'SAME' if same else 'DIFFERENT'} weights; {trace_divergence(trace, full_trace)}; "
              f"{resumed}", flush=True)


if __name__ == "__main__":
    main()
