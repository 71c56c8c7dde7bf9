"""The trainer's two precision knobs, kept apart because they fix different gaps: the weights
the forward sees (`weight_dtype`: the engine's rounded values, gradient straight through to
fp32 masters) and the arithmetic it runs in (`compute_dtype`: autocast)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {tuple(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


def rounded_parameters(module: nn.Module, dtype: str) -> dict[str, torch.Tensor]:
    """Each parameter's value rounded to `dtype` (kept in fp32), with a straight-through gradient.

    Exact: round(w) - w is exact in fp32 (the two are within a factor of two), so adding it
    back to w gives round(w) bit for bit.
    """
    target = torch_dtype(dtype)
    return {name: p + (p.detach().to(target).float() - p.detach())
            for name, p in module.named_parameters()}


def autocast(device_type: str, dtype: str) -> contextlib.AbstractContextManager:
    """torch.autocast in `dtype`, or nothing for fp32."""
    if torch_dtype(dtype) == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=torch_dtype(dtype))
