"""The GRPO step, timed: a profile's study settings (the local profile: the real model, 8x8
answers, 384 new tokens, lr 1e-6) for a few steps in each variant (mode x trainer arithmetic
x fix), each variant in a process of its own so that its peak GPU memory is its own.
Medians over the steps after the first two (warm-up: graph capture, allocator growth).

    python -m dev.grpo_step --config config/local.yaml --steps 12 \\
        --variants colocated:fp32,split:bf16,colocated:fp32:exact --out grpo-step.json

A variant is MODE:COMPUTE[:FIX], FIX one of none (default), fix (rounded weights), exact.
`--overhead FILE` reads such a record back: each exact variant's cost over the fix variant of
the same mode and arithmetic, per step and per trained token."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ratchet.gpu_memory import ProcessPeak

FIXES = {"none": {}, "fix": {"round_weights": True}, "exact": {"round_weights": True, "exact_forward": True}}
TIMES = ("time/step_s", "time/generate_s", "time/train_s", "time/sync_s", "time/wait_s")
GAPS = ("mismatch/logprob_abs_diff_mean", "mismatch/logprob_abs_diff_max", "mismatch/kl_k3",
        "rollout/stale_token_share", "train/num_tokens", "train/reward")
PREPARE = ("download_model", "download_data", "convert_weights")


def parse_variant(text: str) -> dict:
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("colocated", "split") \
            or parts[1] not in ("fp32", "fp16", "bf16") or (len(parts) == 3 and parts[2] not in FIXES):
        raise SystemExit(f"--variants: {text!r} is not MODE:COMPUTE[:FIX] (mode colocated|split, "
                         f"compute fp32|fp16|bf16, fix {'|'.join(FIXES)})")
    return {"name": text, "mode": parts[0], "compute_dtype": parts[1], "fix": parts[2] if len(parts) == 3 else "none"}


def exact_fix_overhead(record: dict) -> dict:
    """{exact variant: its step-median share over the matching fix variant's, raw and per
    trained token}. The two sample different answers (the batch-invariant engine's
    log-probabilities differ in the last bits), so their steps train different token counts:
    per token is the figure to quote."""
    medians = {v["name"]: v["median"] for v in record["variants"] if "median" in v}
    out = {}
    for name, exact in medians.items():
        fix = medians.get(name.removesuffix(":exact") + ":fix") if name.endswith(":exact") else None
        if fix is None:
            continue
        step, tokens = "time/step_s", "train/num_tokens"
        out[name] = {"raw_median": exact[step] / fix[step] - 1,
                     "per_token": (exact[step] / exact[tokens]) / (fix[step] / fix[tokens]) - 1}
    return out


def prepare(cfg: dict) -> None:
    """The converted model and the data splits, made by their stages if the model is missing."""
    from ratchet.paths import RunPaths
    from ratchet.stages import run_stage

    if not RunPaths.from_config(cfg).manifest.is_file():
        for stage in PREPARE:
            run_stage(stage, cfg)


def step_medians(rows, steps: int) -> dict:
    """{"median": times and gaps over the steps after the first two, "steps_without_gap"}. A
    step whose groups all scored alike trains on nothing and logs no gap (NaN in its row):
    the gaps' medians skip such steps, and count them."""
    timed = rows[rows["step"] >= min(2, steps - 1)]
    gaps = [k for k in GAPS if k in timed]
    return {"median": {**{k: float(np.median(timed[k])) for k in TIMES if k in timed},
                       **{k: float(np.nanmedian(timed[k])) for k in gaps}},
            "steps_without_gap": int(timed[gaps[0]].isna().sum()) if gaps else None}


def run_variant(config: str, overrides: list[str], variant: dict, steps: int, out: Path) -> dict:
    """One variant in this process: the prepare stages if their outputs are missing, then
    `steps` GRPO steps without evals, checkpoints or a saved model; the step medians."""
    import torch

    from ratchet import config as config_mod
    from ratchet.rl.colocated import run_colocated
    from ratchet.rl.split import run_split
    from ratchet.stages.train import make_job

    os.environ.setdefault("RATCHET_TRACKING", "off")
    cfg = config_mod.load(config, overrides)
    prepare(cfg)
    job = make_job(cfg, variant["mode"], out_dir=out, steps=steps, eval_every=0, checkpoints=False,
                   save_model=False, resume=False, compute_dtype=variant["compute_dtype"],
                   **FIXES[variant["fix"]])
    start = time.perf_counter()
    summary = (run_colocated if variant["mode"] == "colocated" else run_split)(job)
    wall = time.perf_counter() - start
    import pandas as pd

    rows = pd.read_parquet(out / "metrics.parquet")
    result = {**variant, "steps": steps, "wall_s": wall, "engine_in": summary.get("engine_in"),
              **step_medians(rows, steps), "per_step_s": [float(x) for x in rows["time/step_s"]]}
    if torch.cuda.is_available():
        result["torch_max_reserved_gb"] = torch.cuda.max_memory_reserved() / 2 ** 30
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config/local.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--variants", default="colocated:fp32,colocated:bf16,split:bf16")
    ap.add_argument("--out")
    ap.add_argument("--overhead", metavar="FILE", help="a record of this bench: the exact fix's cost over the fix")
    ap.add_argument("--switch-interval-ms", type=float, default=None,
                    help="the interpreter's thread switch interval in each variant's process (Python's "
                         "default 5 ms): how long the engine's thread may wait for the GIL in split on one GPU")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: run this variant, JSON to --out
    args = ap.parse_args(argv)
    if args.overhead:
        print(json.dumps(exact_fix_overhead(json.loads(Path(args.overhead).read_text())), indent=1))
        return
    if not args.out:
        ap.error("--out is required (or --overhead FILE)")
    if args.steps < 3:
        raise SystemExit("--steps: at least 3 (the first two are warm-up)")
    if args.switch_interval_ms is not None and args.switch_interval_ms <= 0:
        raise SystemExit(f"--switch-interval-ms: must be > 0, got {args.switch_interval_ms}")
    if args.one:
        if args.switch_interval_ms is not None:
            sys.setswitchinterval(args.switch_interval_ms / 1e3)
        with tempfile.TemporaryDirectory() as tmp:
            result = run_variant(args.config, args.overrides, parse_variant(args.one), args.steps, Path(tmp))
        Path(args.out).write_text(json.dumps(result, indent=1))
        return
    variants = [parse_variant(v) for v in args.variants.split(",")]
    results = []
    for i, variant in enumerate(variants):
        part = Path(args.out).with_suffix(f".{i}.json")
        cmd = [sys.executable, "-m", "dev.grpo_step", "--config", args.config, "--steps",
               str(args.steps), "--one", variant["name"], "--out", str(part)]
        for o in args.overrides:
            cmd += ["--set", o]
        if args.switch_interval_ms is not None:
            cmd += ["--switch-interval-ms", str(args.switch_interval_ms)]
        print(f"[grpo_step] {variant['name']}: {args.steps} steps", flush=True)
        child = subprocess.Popen(cmd)
        memory = ProcessPeak(child.pid, every_s=0.2)
        rc = child.wait()
        peak = memory.stop() or 0.0
        if rc != 0:
            results.append({**variant, "error": f"exit status {rc}"})
            print(f"[grpo_step] {variant['name']} failed (exit status {rc})", flush=True)
            write(args, results, done=i + 1 == len(variants))
            continue
        result = json.loads(part.read_text())
        part.unlink()
        result["peak_gpu_mem_gb"] = peak
        results.append(result)
        m = result["median"]
        print(f"[grpo_step] {variant['name']}: step {m['time/step_s']:.3f}s  generate "
              f"{m['time/generate_s']:.3f}s  train {m['time/train_s']:.3f}s  sync {m['time/sync_s'] * 1e3:.1f}ms  "
              f"gap mean {m.get('mismatch/logprob_abs_diff_mean', float('nan')):.2e}  peak {peak:.1f} GB", flush=True)
        write(args, results, done=i + 1 == len(variants))  # after each: a time limit keeps what ran


def write(args, results: list[dict], done: bool) -> None:
    out = Path(args.out)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"config": args.config, "overrides": args.overrides, "steps": args.steps,
                               "switch_interval_ms": args.switch_interval_ms or sys.getswitchinterval() * 1e3,
                               "complete": done, "variants": results}, indent=1))
    tmp.replace(out)


if __name__ == "__main__":
    main()
