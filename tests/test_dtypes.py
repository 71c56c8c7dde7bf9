"""Host rounding to the engine dtypes: torch's CPU casts (taken where the process has torch, for
large arrays) give NumPy's bits, on the patterns where rounding is delicate and on a sweep of
random ones. Every one of the 2**32 fp32 patterns was compared once too (the twenty-fifth
session; `python -m tests.test_dtypes`, ~10 min on 2 cores): equal but NaNs, which keep NumPy's."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from ratchet.model import dtypes
from ratchet.model.dtypes import fp16_values, fp32_to_bf16_bits, round_to


def delicate() -> np.ndarray:
    """fp32 patterns around every rounding edge of fp16 and bf16: ties to even both ways, the
    subnormal ranges, overflow to infinity, signed zeros, infinities and NaNs with payloads."""
    f = np.float32
    ties16 = [f(1 + 2.0 ** -11), f(1 + 3 * 2.0 ** -11), f(2.0 ** -25), f(3 * 2.0 ** -25), f(65504 + 16),
              f(65504 + 15.99), f(2.0 ** -14 - 2.0 ** -25)]
    tiesbf = np.array([0x3F808000, 0x3F818000, 0x00008000, 0x00018000, 0x7F7F8000, 0x7F7F7FFF],
                      dtype=np.uint32).view(np.float32)
    special = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001,
                        0xFFFFFFFF, 0x7FBFFFFF, 0x00000001, 0x807FFFFF, 0x7F7FFFFF], dtype=np.uint32).view(np.float32)
    ties = np.array(ties16, dtype=np.float32)
    around = np.concatenate([np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])
    base = np.concatenate([ties, tiesbf, special, around])
    return np.concatenate([base, -base])


def numpy_only(monkeypatch):
    monkeypatch.setattr(dtypes, "TORCH_CAST_MIN", 1 << 62)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_torch_casts_give_numpys_bits(dtype, monkeypatch):
    rng = np.random.default_rng(0)
    sweep = rng.integers(0, 1 << 32, size=1 << 22, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = rng.standard_normal(1 << 20).astype(np.float32) * np.float32(2.0) ** rng.integers(-30, 20, 1 << 20)
    x = np.concatenate([np.tile(delicate(), 64), sweep, scaled.astype(np.float32)])
    assert x.size >= dtypes.TORCH_CAST_MIN and "torch" in sys.modules
    fast = {"values": round_to(x, dtype), "bits": fp32_to_bf16_bits(x) if dtype == "bf16" else fp16_values(x)}
    numpy_only(monkeypatch)
    slow = {"values": round_to(x, dtype), "bits": fp32_to_bf16_bits(x) if dtype == "bf16" else fp16_values(x)}
    for k in fast:
        assert fast[k].shape == x.shape
        assert np.array_equal(fast[k].view(np.uint32 if k == "values" else np.uint16),
                              slow[k].view(np.uint32 if k == "values" else np.uint16)), k
    assert np.isnan(fast["values"][np.isnan(x)]).all()


def test_small_arrays_and_scalars_stay_on_numpy():
    assert dtypes._torch_for(np.zeros(16, np.float32)) is None
    assert round_to(np.float32(1.0), "fp16") == 1.0 and round_to(np.float32(1.0), "bf16") == 1.0
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        round_to(np.zeros(4, np.float32), "fp8")


def test_a_read_only_array_is_rounded_without_a_warning(recwarn):
    x = np.linspace(-3, 3, dtypes.TORCH_CAST_MIN, dtype=np.float32)
    x.setflags(write=False)
    out = round_to(x, "bf16")
    assert out.flags.writeable and not [w for w in recwarn if "not writable" in str(w.message)]
    assert np.array_equal(out, round_to(x.copy(), "bf16"))


def exhaustive(chunk: int = 1 << 26) -> dict[str, int]:
    """Every fp32 pattern, torch's cast against NumPy's: the differing patterns, NaN or not."""
    torch.set_num_threads(max(1, torch.get_num_threads()))
    bad = {"fp16": 0, "bf16": 0, "fp16 NaN": 0, "bf16 NaN": 0}
    for start in range(0, 1 << 32, chunk):
        x = np.arange(start, start + chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
        nan = np.isnan(x)
        t = torch.from_numpy(x)
        with np.errstate(over="ignore"):
            pairs = {"fp16": (x.astype(np.float16).view(np.uint16), t.to(torch.float16)),
                     "bf16": (dtypes._numpy_bits(x, "bf16"), t.to(torch.bfloat16))}
        for name, (want, got) in pairs.items():
            differ = want != got.view(torch.int16).numpy().view(np.uint16)
            bad[name] += int((differ & ~nan).sum())
            bad[f"{name} NaN"] += int((differ & nan).sum())
    return bad


if __name__ == "__main__":
    print(exhaustive())
