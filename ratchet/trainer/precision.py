"""The trainer's two precision knobs, kept apart because they fix different gaps: the weights
the forward sees (`weight_dtype`: the engine's rounded values, gradient straight through to
fp32 masters) and the arithmetic it runs in (`compute_dtype`: autocast)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {tuple(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


# Optimiser steps taken in this process, by any optimiser: fused AdamW updates the parameters
# in place without moving their version counters, so the rounding cache below keys on this too.
_optimizer_steps = [0]


def _count_step(optimizer, args, kwargs) -> None:
    _optimizer_steps[0] += 1


register_optimizer_step_post_hook(_count_step)


class _StraightThrough(torch.autograd.Function):
    """The forward sees `value`, the gradient goes to `param` unchanged."""

    @staticmethod
    def forward(ctx, param, value):
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def rounded_parameters(module: nn.Module, dtype: str) -> dict[str, torch.Tensor]:
    """Each parameter's value rounded to `dtype` (kept in fp32), with a straight-through gradient.

    round(w) is computed once per value of the masters, not once per micro-batch: a cache on
    the module keyed by the process's optimiser step count (any optimiser's step, fused ones
    included), the parameter's version counter (any other in-place change: a load, a restore)
    and its storage. The values are those of w + (round(w) - w), bit for bit: round(w) - w is
    exact in fp32 (the two are within a factor of two), so adding it back to w gives round(w);
    the gradient is the same identity.
    """
    target = torch_dtype(dtype)
    cache = module.__dict__.setdefault("_rounded_cache", {})
    out = {}
    for name, p in module.named_parameters():
        # one entry a parameter, whatever the dtype: the cache holds at most one fp32 copy of the
        # masters (a trainer scoring fp16 then bf16 weights, as the decomposition does, rounds again)
        key, stamp = name, (target, _optimizer_steps[0], p._version, p.data_ptr(), p.shape)
        hit = cache.get(key)
        if hit is None or hit[0] != stamp:
            with torch.no_grad():
                hit = cache[key] = (stamp, p.detach().to(target).float())
        out[name] = _StraightThrough.apply(p, hit[1]) if p.requires_grad else hit[1]
    return out


def autocast(device_type: str, dtype: str) -> contextlib.AbstractContextManager:
    """torch.autocast in `dtype`, or nothing for fp32."""
    if torch_dtype(dtype) == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=torch_dtype(dtype))
