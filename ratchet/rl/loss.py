"""GRPO's loss pieces as small pure functions that tests call directly (tiny-grpo's
`loss.py`), and the registry of policy-loss variants. The loss is a token mean over the
whole batch: micro-batch gradients summed give exactly its gradient."""

from __future__ import annotations

from typing import Callable

import torch

from ratchet.rl.loss_names import ADVANTAGE_SCALES, IS_LEVELS  # noqa: F401  (re-exported)

# policy-loss variant -> its per-token loss weight (old_trainer, engine, mask, cfg) -> [B, T]
POLICY_LOSSES: dict[str, Callable] = {}


def register_policy_loss(name: str):
    """Add a variant of the loss (verl's registry): `train.is_correction` names one."""
    def add(fn: Callable) -> Callable:
        POLICY_LOSSES[name] = fn
        return fn
    return add


def group_advantages(rewards: torch.Tensor, scale: str = "std", eps: float = 1e-6) -> torch.Tensor:
    """rewards [n_groups, G] -> advantages [n_groups, G].

    "std": (r - mean) / (std + eps), the GRPO paper (std with Bessel's correction, as
    TRL and verl compute it). "none": r - mean, Dr. GRPO (no per-question difficulty weight).
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"advantage scale {scale!r} is not one of {ADVANTAGE_SCALES}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # [n_groups, G]
    if scale == "none":
        return centred
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(centred[:, :1])
    return centred / (std + eps)


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """[n_groups] bool: groups whose answers did not all score the same (the others have
    zero advantage everywhere and only dilute the token mean, so they are skipped)."""
    return (rewards != rewards[:, :1]).any(dim=1)


def clipped_objective(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      eps_low: float = 0.2, eps_high: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token loss -min(r A, clip(r, 1-eps_low, 1+eps_high) A) and where it is clipped.

    logp, old_logp [B, T]; advantages [B] (one per answer) or [B, T]. Returns (loss [B, T],
    clipped [B, T] bool): clipped marks the tokens whose gradient the clip stops, i.e.
    A > 0 with r > 1+eps_high, and A < 0 with r < 1-eps_low.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # [B, 1]
    ratio = torch.exp(logp - old_logp)  # [B, T]
    unclipped = ratio * advantages
    clipped_value = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped_value)
    clipped = ((advantages > 0) & (ratio > 1.0 + eps_high)) | ((advantages < 0) & (ratio < 1.0 - eps_low))
    return loss, clipped


def _log_ratio(old_trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor,
               level: str) -> torch.Tensor:
    """log(pi_old_trainer / pi_engine) per token, or summed over each answer (broadcast to
    its tokens) at the sequence level. [B, T]"""
    if level not in IS_LEVELS:
        raise ValueError(f"importance-sampling level {level!r} is not one of {IS_LEVELS}")
    log_ratio = (old_trainer - engine) * mask  # [B, T]
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(old_trainer)
    return log_ratio


def tis_weights(old_trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor,
                cap: float = 2.0, level: str = "token") -> torch.Tensor:
    """Truncated importance sampling (Yao et al. 2025): min(pi_old_trainer / pi_engine, cap),
    per token or per answer (the product of its tokens' ratios). [B, T], no gradient."""
    log_ratio = _log_ratio(old_trainer.detach(), engine, mask, level)
    return torch.exp(log_ratio).clamp(max=cap) * mask


def mis_weights(old_trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor,
                low: float = 0.5, high: float = 2.0, level: str = "token") -> torch.Tensor:
    """Masked importance sampling: 1 where pi_old_trainer / pi_engine lies in [low, high],
    0 where it leaves the bound (the token, or the whole answer at the sequence level). [B, T]"""
    ratio = torch.exp(_log_ratio(old_trainer.detach(), engine, mask, level))
    return ((ratio >= low) & (ratio <= high)).to(old_trainer.dtype) * mask


@register_policy_loss("none")
def plain_weights(old_trainer, engine, mask, cfg) -> torch.Tensor:
    """No correction: every real token weighs 1."""
    return mask.to(old_trainer.dtype)


@register_policy_loss("tis")
def tis_loss_weights(old_trainer, engine, mask, cfg) -> torch.Tensor:
    return tis_weights(old_trainer, engine, mask, cfg.tis_cap, cfg.is_level)


@register_policy_loss("mis")
def mis_loss_weights(old_trainer, engine, mask, cfg) -> torch.Tensor:
    return mis_weights(old_trainer, engine, mask, cfg.mis_low, cfg.mis_high, cfg.is_level)


def correction_weights(kind: str, old_trainer: torch.Tensor, engine: torch.Tensor,
                       mask: torch.Tensor, cfg) -> torch.Tensor:
    """The per-token loss weight of the registered variant `kind` (cfg: its knobs)."""
    if kind not in POLICY_LOSSES:
        raise ValueError(f"policy loss {kind!r} is not one of {tuple(POLICY_LOSSES)}")
    return POLICY_LOSSES[kind](old_trainer, engine, mask, cfg)


def straight_through(values: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
    """`values` bit for bit (lp - lp is 0) with lp's gradient: the exact forward, whose
    values are the engine's and whose gradient is the torch forward's."""
    return values + (lp - lp.detach())


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, weights: torch.Tensor, num_tokens: int | float,
                eps_low: float = 0.2, eps_high: float = 0.2) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped objective, weighted, summed over this micro-batch's tokens and divided by
    `num_tokens` (the tokens of the whole batch). Returns (loss, sums for the metrics), the
    sums as 0-d tensors on logp's device: a float() here would make the host wait for the GPU
    after every micro-batch (update reads them once a mini-batch)."""
    per_token, clipped = clipped_objective(logp, old_logp, advantages, eps_low, eps_high)  # [B, T]
    maskf = mask.to(logp.dtype)
    loss = (per_token * weights * maskf).sum() / num_tokens
    with torch.no_grad():
        sums = {"clipped": (clipped & mask).sum(), "ratio": (torch.exp(logp - old_logp) * maskf).sum()}
    return loss, sums
