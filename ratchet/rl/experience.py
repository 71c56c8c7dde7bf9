"""The one object that crosses from rollout to update (tiny-grpo's `Experience`): a step's
answers, the trained ones as [n, T] tensors that the update fills with the trainer's side."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ratchet.rl.loss import group_advantages, informative_groups, straight_through
from ratchet.rl.rollout import Group


def pad(rows: list[list[float]], width: int, dtype=torch.float32, device="cpu") -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=dtype)
    return out.to(device)


@dataclass
class Experience:
    # the kept answers (the trained ones), one row each
    prompts: list[list[int]]
    responses: list[list[int]]
    mask: torch.Tensor  # [n, T] bool, real tokens
    engine: torch.Tensor  # [n, T] the engine's sampling-time log-probs
    stale: torch.Tensor  # [n, T] bool, drawn by older weights than the trainer's
    advantages: torch.Tensor  # [n]
    trainer: torch.Tensor  # [n, T] the trainer's log-probs before the update (the update fills it)
    entropy: torch.Tensor  # [n, T] (filled with `trainer`)
    old: torch.Tensor  # [n, T] the PPO ratio's denominator (filled with `trainer`)
    weights: torch.Tensor  # [n, T] the per-token loss weight (filled with `trainer`)
    # every answer of the step, flattened group by group (the step's metrics count them)
    rewards: np.ndarray  # [B]
    response_lengths: np.ndarray  # [B] float64
    finish_reasons: list[str]
    group_index: np.ndarray  # [B] stream index of each answer's group
    keep: np.ndarray  # [B] bool, trained
    exact: torch.Tensor | None = None  # [n, T] the engine's values of the forward (exact_forward)

    @classmethod
    def from_answers(cls, prompts, responses, engine_logprobs, versions, rewards: np.ndarray,
                     advantages: np.ndarray, keep: np.ndarray, finish_reasons, group_index,
                     version: int, device) -> "Experience":
        """Every answer of the step as lists ([B] arrays for rewards, advantages, keep);
        `version`: the updates the trainer's weights have seen (older tokens are stale)."""
        kept = lambda values: [v for v, k in zip(values, keep) if k]  # noqa: E731
        kept_responses = kept(responses)
        n, width = len(kept_responses), max((len(r) for r in kept_responses), default=0)
        lengths = torch.tensor([len(r) for r in kept_responses], dtype=torch.int64)
        zeros = lambda: torch.zeros(n, width, device=device)  # noqa: E731
        return cls(kept(prompts), kept_responses,
                   mask=(torch.arange(width)[None, :] < lengths[:, None]).to(device),
                   engine=pad(kept(engine_logprobs), width, device=device),
                   stale=pad(kept(versions), width, torch.int64, device) < version,
                   advantages=torch.tensor(advantages[keep], dtype=torch.float32, device=device),
                   trainer=zeros(), entropy=zeros(), old=zeros(), weights=zeros(),
                   rewards=rewards, response_lengths=np.array([len(r) for r in responses], dtype=np.float64),
                   finish_reasons=list(finish_reasons), group_index=group_index, keep=keep)

    def forward_values(self, lp: torch.Tensor, rows) -> torch.Tensor:
        """The trainer's log-probs of `rows` ([b, t], with gradient) as the loss sees them:
        lp, or with the exact forward the engine's values and lp's gradient."""
        if self.exact is None:
            return lp
        return straight_through(self.exact[rows, :lp.shape[1]], lp)


def make_experience(groups: list[Group], task, cfg, version: int, device="cpu") -> Experience:
    """Rewards, group advantages and the kept answers (constant groups skipped, empty
    answers never trained) of one step's groups."""
    reqs = [r for g in groups for r in g.requests]
    rewards = torch.tensor([[task.reward(r.output, task.targets[g.problem]) for r in g.requests]
                            for g in groups], dtype=torch.float64)  # [n_groups, G]
    advantages = group_advantages(rewards, cfg.advantage)
    keep = (informative_groups(rewards) if cfg.skip_constant_groups
            else torch.ones(len(groups), dtype=torch.bool))
    keep = keep[:, None].expand_as(rewards)
    return Experience.from_answers(
        [r.prompt for r in reqs], [list(r.output) for r in reqs], [list(r.logprobs) for r in reqs],
        [v for g in groups for v in g.versions], rewards.flatten().numpy(),
        advantages.flatten().numpy(),
        keep.flatten().numpy() & np.array([len(r.output) > 0 for r in reqs], bool),
        [r.finish_reason for r in reqs], np.repeat([g.index for g in groups], cfg.group_size),
        version, device)
