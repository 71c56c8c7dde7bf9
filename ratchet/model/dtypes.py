"""Rounding fp32 to the engine dtypes on the host, bit for bit as torch and the GPU do it: in
NumPy, or by torch's CPU casts where the process has torch (the same bits, several times faster).

NumPy has no bfloat16, so bf16 values travel as float32 arrays whose values lie on the bf16
grid (exactly representable), or as their uint16 bit patterns on disk. Both conversions are
round-to-nearest-even, the rule torch's `.to(dtype)` and CUDA's `__float2half_rn` follow.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np

from ratchet.model.layout import DTYPES

# From this many values on, a process that has torch casts with it: the same bits as NumPy's
# casts for every fp32 pattern but NaN's (tests/test_dtypes.py; NaNs keep NumPy's), several times
# faster (vectorised and threaded: NumPy's float16 cast is scalar and its bf16 one four passes),
# and a 0.5B model's weights are rounded whole every time an ablation run builds an engine.
TORCH_CAST_MIN = 1 << 16


def _torch_for(x: np.ndarray):
    """torch where this process has already imported it and `x` is large enough to gain."""
    return sys.modules.get("torch") if x.size >= TORCH_CAST_MIN else None


def _numpy_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """NumPy's cast of fp32 `x` to `dtype` ("fp16", "bf16"), as uint16 bit patterns."""
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).view(np.uint16)
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():  # keep NaN a quiet NaN instead of rounding its payload into infinity
        rounded = np.where(nan, np.uint16(0x7FC0), rounded)
    return rounded


def _widen(bits: np.ndarray, dtype: str) -> np.ndarray:
    """The float32 values of fp16 or bf16 bit patterns (exact)."""
    return bits.view(np.float16).astype(np.float32) if dtype == "fp16" else bf16_bits_to_fp32(bits)


def _torch_cast(x: np.ndarray, dtype: str, torch, back: bool = False) -> np.ndarray:
    """x cast to `dtype` by torch: its bit patterns (uint16), or with `back` its values as
    float32; NaNs as NumPy makes them."""
    x = np.ascontiguousarray(x)
    with warnings.catch_warnings():  # a read-only array (a mapped file) is only read here
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        t = torch.from_numpy(x).to(torch.float16 if dtype == "fp16" else torch.bfloat16)
    out = t.float().numpy() if back else t.view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        bits = _numpy_bits(x[nan], dtype)
        out[nan] = _widen(bits, dtype) if back else bits
    return out


def _bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round-to-nearest-even fp32 -> `dtype` ("fp16", "bf16"), as uint16 bit patterns."""
    x = np.asarray(x, dtype=np.float32)
    torch = _torch_for(x)
    return _numpy_bits(x, dtype) if torch is None else _torch_cast(x, dtype, torch)


def fp16_values(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even fp32 -> float16 array."""
    return _bits(x, "fp16").view(np.float16)


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even fp32 -> bf16, returned as uint16 bit patterns."""
    return _bits(x, "bf16")


def bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 array of the values `x` takes once stored in `dtype` ("fp32", "fp16", "bf16")."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp32":
        return x
    if dtype not in ("fp16", "bf16"):
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    if (torch := _torch_for(x)) is not None:
        return _torch_cast(x, dtype, torch, back=True)
    return _widen(_numpy_bits(x, dtype), dtype)
