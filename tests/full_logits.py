"""The plain [B, T, V] logits of a policy: the reference its chunked LM head is checked against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ratchet.trainer.policy import Policy


def full_logits(policy: Policy, input_ids: torch.Tensor) -> torch.Tensor:
    return F.linear(policy.hidden_states(input_ids), policy.head_weight())  # [B, T, V]
