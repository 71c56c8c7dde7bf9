"""The trainer's two precision knobs, kept apart because they fix different things.

- `weight_dtype`: the forward pass sees the weights the engine holds (rounded to fp16/bf16), while
  the optimiser keeps updating fp32 masters: w_used = w + (round(w) - w).detach(), so the gradient
  passes straight through the rounding. This removes the weight part of the training-inference gap.
- `compute_dtype`: autocast, i.e. matmuls in fp16/bf16 like the engine's kernels.
- `storage_dtype` (`engine_storage`): fp32 arithmetic, but every activation rounded to fp16/bf16
  where the engine stores it (the NumPy backend's `_store` points), again with a
  straight-through gradient: the engine's function up to fp32 summation order.
"""

from __future__ import annotations

import contextlib
import contextvars

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


_STORAGE: contextvars.ContextVar[torch.dtype | None] = contextvars.ContextVar("ratchet_storage", default=None)


@contextlib.contextmanager
def engine_storage(dtype: str | None):
    """Inside: `store` rounds activations to `dtype` (None or "fp32": no rounding)."""
    token = _STORAGE.set(None if dtype in (None, "fp32") else torch_dtype(dtype))
    try:
        yield
    finally:
        _STORAGE.reset(token)


def store(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the storage dtype of `engine_storage` (kept in x's dtype), gradient straight
    through; x itself outside it. Exact for the same reason as `rounded_parameters`."""
    dtype = _STORAGE.get()
    if dtype is None:
        return x
    d = x.detach()
    return x + (d.to(dtype).to(x.dtype) - d)

