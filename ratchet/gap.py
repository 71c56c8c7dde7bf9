"""How far apart two policies are on the same sampled tokens (KL(engine || trainer) from the
engine's samples, ratio bands, also under verl's and TRL's names so runs compare across
tools): pure NumPy, so the RL loop and the ablations both measure with it."""

from __future__ import annotations

import numpy as np

# token-probability buckets of the engine's sampled tokens: (name, lower, upper); the "toxic
# tails" that importance-sampling corrections worry about are the low buckets
PROB_BUCKETS = (("p_lt_1e-3", 0.0, 1e-3), ("p_1e-3_to_0.1", 1e-3, 0.1), ("p_0.1_to_0.5", 0.1, 0.5),
                ("p_0.5_to_0.9", 0.5, 0.9), ("p_ge_0.9", 0.9, 1.0 + 1e-12))


def bucket_metrics(engine: np.ndarray, absd: np.ndarray, prefix: str) -> dict[str, float]:
    """Share of tokens and mean / max |dlogp| per bucket of the engine's token probability
    (buckets without tokens are left out)."""
    p = np.exp(engine)
    out = {}
    for name, low, high in PROB_BUCKETS:
        inside = (p >= low) & (p < high)
        if inside.any():
            out[f"{prefix}by_prob/{name}/token_share"] = float(inside.mean())
            out[f"{prefix}by_prob/{name}/logprob_abs_diff_mean"] = float(absd[inside].mean())
            out[f"{prefix}by_prob/{name}/logprob_abs_diff_max"] = float(absd[inside].max())
    return out


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
    out.update(bucket_metrics(e, absd, prefix))
    return out
