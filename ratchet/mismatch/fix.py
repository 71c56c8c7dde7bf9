"""ablate_fix: GRPO runs from the same seeds that differ in one knob each (FIX_RUNS): the
fix and the exact fix against importance-sampling corrections, scored after training."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ratchet.gap import gap_metrics
from ratchet.mismatch.ablation import AblateSettings, Setup, Trajectory, greedy_eval

# the gap metrics a row keeps, under short names (engine vs the trainer, per token)
SYNC_COLUMNS = ("sync/visible_share", "sync/masters_off_grid_share", "sync/weights_parity")
GAP_COLUMNS = {
    "mismatch/logprob_abs_diff_mean": "gap_mean",
    "mismatch/logprob_abs_diff_p99": "gap_p99",
    "mismatch/logprob_abs_diff_max": "gap_max",
    "mismatch/ratio_outside_share": "ratio_outside_share",
    "mismatch/kl_k3": "kl_k3",
}


def fresh_gap(policy, engine, prompts: list[list[int]], max_new_tokens: int, seed: int,
              temperature: float, eps: float, weight_dtype: str = "fp32",
              compute_dtype: str = "fp32", exact_batch_size: int | None = None) -> dict[str, float]:
    """Sync `engine` from the masters, sample one answer per prompt, and measure the gap to
    the trainer variant on those tokens (short column names); with `exact_batch_size`, to the
    engine's own teacher forcing in groups of that many answers (the exact fix)."""
    from ratchet.mismatch.compare import (
        engine_logprobs,
        exact_logprobs,
        sample,
        trainer_logprobs,
    )
    from ratchet.rl.sync import sync_weights

    sync_weights(engine, policy)
    reqs = sample(engine, prompts, max_new_tokens, seed, temperature)
    if exact_batch_size:
        t = exact_logprobs(engine, reqs, temperature, exact_batch_size)
    else:
        t = trainer_logprobs(policy, reqs, temperature, weight_dtype, compute_dtype)
    return short_gap(gap_metrics(engine_logprobs(reqs), t, eps=eps))


def short_gap(metrics: dict[str, float]) -> dict[str, float]:
    return {short: float(metrics.get(key, np.nan)) for key, short in GAP_COLUMNS.items()}


def fix_runs(setup: Setup, settings: AblateSettings, names=None, log=None,
             laps=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each of `names` (default `settings.fix_runs`; fix_run), one after another: (steps, runs)
    concatenated in that order. A run's engines go with it, and CuPy's pool hands their blocks
    back before the next run starts (gpu_memory.release_cupy_cache)."""
    from ratchet.gpu_memory import release_cupy_cache

    parts = []
    for name in names or settings.fix_runs:
        parts.append(fix_run(setup, settings, name, log=log, laps=laps))
        release_cupy_cache()
    return gather([p[0] for p in parts]), gather([p[1] for p in parts])


def gather(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The runs' rows in the order given, as fix_runs makes them (the pipeline runs each run as a
    job of its own and gathers them with this)."""
    return pd.concat(frames, ignore_index=True)


def fix_run(setup: Setup, settings: AblateSettings, name: str, log=None, laps=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One run of FIX_RUNS for `fix_steps` steps from the ablations' seeds: (steps, run), per
    step the reward and the loss's gap on that step's rollouts, and one row of the after-training
    accuracy and the gap on fresh rollouts; `log(run, step, row)` after every step. Runs share
    no state but `setup`'s read-only weights, so each is the same alone as in a sequence.
    `laps` (runtime.Laps): where the time goes, by phase."""
    from ratchet.rl.runtime import Laps

    laps = Laps() if laps is None else laps
    step_rows = []
    cfg = settings.grpo(name, settings.fix_steps)
    run_setup = setup.for_run(cfg)
    traj = Trajectory(run_setup, cfg)
    laps("trainer and engines")
    for step in range(settings.fix_steps):
        m = traj.train_step(laps, f"{name} steps")
        row = {"run": name, "step": step, "updates": traj.updates,
               "reward": m["train/reward"], "num_tokens": m["train/num_tokens"],
               "is_weight_mean": m["train/is_weight_mean"],
               "is_masked_share": m["train/is_masked_share"],
               "clip_fraction": m["train/clip_fraction"], **short_gap(m),
               **{k.split("/")[1]: m[k] for k in SYNC_COLUMNS}}
        step_rows.append(row)
        if log is not None:
            log(name, step, row)
            laps(f"{name} steps: log")  # its line and metrics (MLflow's store), apart from the rollouts
    final = fresh_gap(traj.policy, traj.engine, setup.measure_prompts, settings.max_new_tokens,
                      settings.seed + 1, settings.temperature, settings.eps,
                      weight_dtype=cfg.weight_dtype, compute_dtype=cfg.compute_dtype,
                      exact_batch_size=cfg.micro_batch_size if cfg.exact_forward else None)
    laps("final gap")
    summary = {"run": name, "steps": settings.fix_steps, "updates": traj.updates,
               "weight_dtype": cfg.weight_dtype, "is_correction": cfg.is_correction,
               "exact_forward": cfg.exact_forward}
    if setup.eval_problems is not None:
        ev, _ = greedy_eval(run_setup, traj, run_setup.eval_engine(cfg.engine_dtype, traj.policy))
        summary.update({"accuracy": ev["accuracy"], "accuracy_stderr": ev["accuracy_stderr"],
                        "eval_n": ev["n"]})
        laps("evals")
    rewards = [r["reward"] for r in step_rows]
    last = rewards[-max(1, len(rewards) // 5):]
    summary["reward_last_fifth"] = float(np.mean(last))
    summary.update({f"final_{k}": v for k, v in final.items()})
    return pd.DataFrame(step_rows), pd.DataFrame([summary])
