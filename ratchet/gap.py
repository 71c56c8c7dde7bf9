"""How far apart two policies are on the same sampled tokens (KL(engine || trainer) from the
engine's samples, ratio bands, also under verl's and TRL's names so runs compare across
tools): pure NumPy, so the RL loop and the ablations both measure with it."""

from __future__ import annotations

import numpy as np


def gap_metrics(engine: np.ndarray, trainer: np.ndarray, eps: float = 0.2,
                prefix: str = "mismatch/") -> dict[str, float]:
    e = np.asarray(engine, dtype=np.float64).ravel()
    t = np.asarray(trainer, dtype=np.float64).ravel()
    if e.shape != t.shape:
        raise ValueError(f"gap_metrics: {e.size} engine log-probs against {t.size} trainer ones")
    if e.size == 0:
        raise ValueError("gap_metrics: no tokens to compare")
    diff = t - e                      # log(pi_trainer / pi_engine) per token
    absd = np.abs(diff)
    ratio = np.exp(diff)
    k1 = float(np.mean(-diff))
    k3 = float(np.mean(ratio - 1.0 - diff))
    prob_diff = np.abs(np.exp(t) - np.exp(e))
    out = {
        f"{prefix}logprob_abs_diff_mean": float(absd.mean()),
        f"{prefix}logprob_abs_diff_p99": float(np.quantile(absd, 0.99)),
        f"{prefix}logprob_abs_diff_max": float(absd.max()),
        f"{prefix}logprob_diff_mean": float(diff.mean()),
        f"{prefix}kl_k1": k1,
        f"{prefix}kl_k3": k3,
        f"{prefix}ratio_outside_share": float(np.mean((ratio < 1 - eps) | (ratio > 1 + eps))),
        f"{prefix}num_tokens": float(e.size),
        # the same quantities under other tools' names
        "rollout_corr/kl": k1,
        "rollout_corr/k3_kl": k3,
        "sampling/sampling_logp_difference/mean": float(absd.mean()),
        "sampling/sampling_logp_difference/max": float(absd.max()),
        "training/rollout_probs_diff_mean": float(prob_diff.mean()),
        "training/rollout_probs_diff_max": float(prob_diff.max()),
        "training/rollout_probs_diff_std": float(prob_diff.std()),
    }
    return out
