"""verify: rerun the first `train.verify_steps` steps of each mode and compare them bit for
bit with the training run (tokens, log-probs, loss, weights); a divergence is reported, not
raised, so the report can show it."""

from __future__ import annotations

import shutil

import pandas as pd

from ratchet.atomic import write_json
from ratchet.errors import InputError
from ratchet.paths import RunPaths
from ratchet.stages.guard import changed_settings
from ratchet.stages.train import MODES, make_job, run_mode

QUANTITIES = ("tokens", "logprobs", "loss", "weights")


def compare_traces(reference: pd.DataFrame, rerun: pd.DataFrame) -> dict:
    """Per quantity, identical or not over the steps both hold, and the first divergence
    (the earliest step; at that step the first quantity in rollout order)."""
    ref = reference.set_index("step")
    new = rerun.set_index("step")
    steps = sorted(set(ref.index) & set(new.index))
    result = {"steps_compared": len(steps), "quantities": {}, "first_divergence": None}
    for q in QUANTITIES:
        bad = [s for s in steps if ref.at[s, q] != new.at[s, q]]
        result["quantities"][q] = {"identical": not bad, "first_step": bad[0] if bad else None}
        if bad and (result["first_divergence"] is None or bad[0] < result["first_divergence"]["step"]):
            result["first_divergence"] = {"step": int(bad[0]), "quantity": q}
    result["identical"] = bool(steps) and result["first_divergence"] is None
    return result


def trace_divergence(trace: pd.DataFrame, reference: pd.DataFrame) -> str:
    """compare_traces in a sentence: the first step where `trace` parts from `reference`, and
    every quantity that differs there (tokens or logprobs: the engine's side; loss or weights:
    the trainer's), or that they agree."""
    result = compare_traces(reference, trace)
    first = result["first_divergence"]
    if first is not None:
        differ = [q for q, r in result["quantities"].items() if r["first_step"] == first["step"]]
        return f"the traces part at step {first['step']}: {', '.join(differ)}"
    if len(trace) != len(reference):
        return f"the traces agree on their first {result['steps_compared']} steps, lengths differ"
    return "the traces agree on every step"


# what a rerun of the first steps does not depend on: where the run lives, the in-training eval
# (the reruns have none), how long the training went on and what it kept on disk
NOT_RERUN = ("results_dir", "eval", "train.steps", "train.verify_steps", "train.eval_every",
             "train.eval_problems", "train.checkpoint_every", "train.keep_checkpoints")


def check_same_training(cfg: dict, paths: RunPaths) -> None:
    """Refuse to compare reruns under these settings with trainings made under others (a stage
    run by hand after a config edit): the difference would be reported as non-determinism."""
    for mode in MODES:
        diff = changed_settings(paths, f"train_{mode}", None, cfg, ignore=NOT_RERUN)
        if diff:
            raise InputError(f"verify: {paths.train_trace(mode)} was made under other settings ({diff}); "
                             f"rerun train_{mode} under these first (snakemake does)")


def verify(cfg: dict, run) -> None:
    """Both modes' reruns in one process, one after the other: each mode's engines go with it,
    and CuPy's pool hands their blocks back before the next mode starts (as ablate_fix's runs
    do), so the second mode's trainer can take what the first mode's engines held (torch
    cannot use the blocks CuPy's pool keeps)."""
    from ratchet.gpu_memory import release_cupy_cache

    paths = RunPaths.from_config(cfg)
    check_same_training(cfg, paths)
    n = min(cfg["train"]["verify_steps"], cfg["train"]["steps"])
    report = {"verify_steps": n}
    for mode in MODES:
        out = paths.verify_dir / mode
        if out.exists():
            shutil.rmtree(out)
        job = make_job(cfg, mode, out_dir=out, steps=n, eval_every=0, checkpoints=False,
                       save_model=False, resume=False)
        run_mode(job, mode)
        release_cupy_cache()
        reference = pd.read_parquet(paths.train_trace(mode))
        result = compare_traces(reference[reference["step"] < n], pd.read_parquet(out / "trace.parquet"))
        report[mode] = result
        verdict = "identical" if result["identical"] else f"DIVERGES at {result['first_divergence']}"
        print(f"[verify] {mode}: {n} steps rerun, {verdict}")
        run.log_metrics({f"verify/{mode}_identical": float(result["identical"])})
    report["identical"] = all(report[m]["identical"] for m in MODES)
    write_json(paths.verify_json, report)
    run.set_tags({"verify.identical": str(report["identical"]).lower()})
    run.log_output(paths.verify_json)
