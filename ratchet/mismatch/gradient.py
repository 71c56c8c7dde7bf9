"""What the gap does to the gradient. On one fresh batch of the engine's rollouts, the policy
gradient of every variant (GRADIENT_VARIANTS) against the on-policy one, after counts of
updates of the decomposition's plain GRPO run (decompose.along_updates, `gradient_at`); no
optimiser step is taken, and the run's own rollouts are not touched (each dtype's batch comes
from a Rollouts of its own seed, on that dtype's measuring engine synced from the masters).

The gradient is update()'s (backward_loss over the whole batch as one mini-batch), before
its norm is clipped: every parameter, flattened, compared in float64."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import torch

from ratchet.mismatch.ablation import AblateSettings, Trajectory
from ratchet.rl.settings import GRPOConfig

# variant -> (the FIX_RUNS run whose GRPO knobs it takes, overrides of those)
GRADIENT_VARIANTS: dict[str, tuple[str, dict]] = {
    # the fp32 forward, old = its own log-probs (ratio 1), no correction: the on-policy gradient
    "reference": ("none", {}),
    # old = the engine's sampling-time log-probs, no correction: a framework that trusts them
    "engine_old": ("none", {"old_logprobs": "engine"}),
    "tis": ("tis", {}),  # old = the trainer's, the loss weighted by min(pi_trainer / pi_engine, cap)
    "mis": ("mis", {}),  # old = the trainer's, tokens whose ratio leaves [low, high] masked
    "fix": ("fix", {}),  # the forward on the masters rounded to the engine dtype, old = its own
    # the fix with the engine's teacher-forced values as its forward's: old = the engine's
    # sampling-time log-probs, as engine_old, and now they are the trainer's own
    "exact": ("exact", {"old_logprobs": "engine"}),
}
SEED_OFFSET = 1000  # the fresh batch after u updates: Rollouts seed = seed + SEED_OFFSET + u


def variant_config(settings: AblateSettings, variant: str, dtype: str) -> GRPOConfig:
    """The GRPOConfig of one variant for an engine of `dtype`."""
    if variant not in GRADIENT_VARIANTS:
        raise ValueError(f"gradient variant {variant!r} is not one of {tuple(GRADIENT_VARIANTS)}")
    run, overrides = GRADIENT_VARIANTS[variant]
    return dataclasses.replace(settings.grpo(run), engine_dtype=dtype, **overrides)


def fresh_groups(engine, task, cfg: GRPOConfig, seed: int, max_tries: int = 20) -> list:
    """One step's groups (problems_per_step x group_size) from a Rollouts of seed `seed`,
    drawn again on the next problems until some group's answers scored differently (a batch
    of constant groups has no gradient)."""
    from ratchet.rl.experience import make_experience
    from ratchet.rl.rollout import Rollouts

    rollouts = Rollouts(task.prompts, cfg.group_size, cfg.max_new_tokens, cfg.temperature, seed,
                        cfg.problems_per_step)
    for step in range(max_tries):
        groups, _ = rollouts.collect(engine, step, version=0)
        if make_experience(groups, task, cfg, version=0).mask.any():
            return groups
    raise RuntimeError(f"the gradient ablation: every group scored the same in {max_tries} fresh batches "
                       "(raise ablate.max_steps_per_update or ablate.group_size)")


def batch_gradient(policy, groups: list, task, cfg: GRPOConfig, engine=None):
    """(gradient per parameter, the Experience its forward filled): the policy gradient of the
    whole batch of `groups` under `cfg` (update's arithmetic, one mini-batch, no clipping, no
    optimiser step); `engine` (exact_forward only) scores the answers. The parameters' .grad
    are left as found."""
    from ratchet.rl.experience import make_experience
    from ratchet.rl.update import backward_loss, exact_values

    params = list(policy.parameters())
    exp = make_experience(groups, task, cfg, version=0, device=params[0].device)
    if cfg.exact_forward:
        exp.exact = exact_values(exp, engine, cfg, engine_sampled=False)  # scored: a measurement
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        for _ in backward_loss(policy, exp, list(range(len(exp.responses))), float(exp.mask.sum()),
                               cfg, scored=False):
            pass
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in params]
    finally:
        for p, g in zip(params, saved):
            p.grad = g
    return grads, exp


def compare_gradients(grads: list[torch.Tensor], ref: list[torch.Tensor]) -> dict[str, float]:
    """Cosine similarity and |g - ref| / |ref| over all parameters (float64), |g| and |ref|."""
    dot = sq = ref_sq = diff_sq = 0.0
    for g, r in zip(grads, ref):
        g64, r64 = g.detach().double().flatten(), r.detach().double().flatten()
        dot += float(torch.dot(g64, r64))
        sq += float(torch.dot(g64, g64))
        ref_sq += float(torch.dot(r64, r64))
        diff_sq += float(torch.sum((g64 - r64) ** 2))
    # sqrt(sq * ref_sq), not |g| |ref|: for g = ref it is sq exactly, and the cosine 1
    scale = math.sqrt(sq * ref_sq)
    cosine = max(-1.0, min(1.0, dot / scale)) if scale > 0 else math.nan
    return {"cosine": cosine, "rel_diff": math.sqrt(diff_sq / ref_sq) if ref_sq > 0 else math.nan,
            "norm": math.sqrt(sq), "ref_norm": math.sqrt(ref_sq)}


def batch_rows(policy, engine, groups: list, task, settings: AblateSettings) -> list[dict]:
    """Every variant's gradient of the same batch against the reference's: one row each."""
    dtype = engine.dtype
    ref_cfg = variant_config(settings, "reference", dtype)
    ref, ref_exp = batch_gradient(policy, groups, task, ref_cfg)
    mask = ref_exp.mask
    gap = (ref_exp.engine - ref_exp.trainer)[mask].double().abs()  # the trainer's own log-probs
    rows = []
    for variant in GRADIENT_VARIANTS:
        cfg = variant_config(settings, variant, dtype)
        grads, exp = (ref, ref_exp) if variant == "reference" else \
            batch_gradient(policy, groups, task, cfg, engine)
        ratio = torch.exp(exp.trainer - exp.old)[mask].double()  # as the loss sees it
        rows.append({"engine_dtype": dtype, "variant": variant, "weight_dtype": cfg.weight_dtype,
                     "old_logprobs": cfg.old_logprobs, "is_correction": cfg.is_correction,
                     "exact_forward": cfg.exact_forward, **compare_gradients(grads, ref),
                     "ratio_max_dev": float((ratio - 1).abs().max()),
                     "weight_mean": float(exp.weights[mask].double().mean()),
                     "num_tokens": int(mask.sum()), "gap_mean": float(gap.mean()),
                     "gap_max": float(gap.max())})
    return rows


def gradient_rows(traj: Trajectory, engine, task, settings: AblateSettings, updates: int) -> list[dict]:
    """The rows of one engine dtype after `updates` updates of `traj`: `engine` (of that dtype,
    not the trajectory's) is synced from the masters and draws a fresh batch from a Rollouts of
    its own seed, on which every variant's gradient is compared with the reference's."""
    from ratchet.rl.sync import sync_weights

    sync_weights(engine, traj.policy)
    cfg = dataclasses.replace(traj.cfg, engine_dtype=engine.dtype)
    groups = fresh_groups(engine, task, cfg, settings.seed + SEED_OFFSET + updates,
                          settings.max_steps_per_update)
    return [{"updates": updates, "steps": traj.step, **r}
            for r in batch_rows(traj.policy, engine, groups, task, settings)]


def gather_dtypes(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The parts of one engine dtype each (gradient_rows along the run), in the rows' order of
    one run measuring every dtype in turn: by update count, then the parts' order."""
    frame = pd.concat(parts, ignore_index=True)
    return frame.sort_values("updates", kind="stable", ignore_index=True)
