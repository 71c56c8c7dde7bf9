"""Rounding fp32 to the engine dtypes in NumPy, bit for bit as torch and the GPU do it.

NumPy has no bfloat16, so bf16 values travel as float32 arrays whose values lie on the bf16
grid (exactly representable), or as their uint16 bit patterns on disk. Both conversions are
round-to-nearest-even, the rule torch's `.to(dtype)` and CUDA's `__float2half_rn` follow.
"""

from __future__ import annotations

import numpy as np

from ratchet.model.layout import DTYPES


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even fp32 -> bf16, returned as uint16 bit patterns."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():  # keep NaN a quiet NaN instead of rounding its payload into infinity
        rounded = np.where(nan, np.uint16(0x7FC0), rounded)
    return rounded


def bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 array of the values `x` takes once stored in `dtype` ("fp32", "fp16", "bf16")."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp32":
        return x
    if dtype == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        return bf16_bits_to_fp32(fp32_to_bf16_bits(x))
    raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
