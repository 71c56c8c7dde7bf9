"""Visibility counting on hand-made arrays: which fp32 changes survive rounding to fp16/bf16."""

from __future__ import annotations

import numpy as np
import pytest

from ratchet.mismatch.visibility import changed_share, moved_share, off_grid_share

FP16_ULP_AT_1 = 2.0 ** -10  # spacing of fp16 in [1, 2)
BF16_ULP_AT_1 = 2.0 ** -7


def test_a_move_under_half_an_fp16_ulp_is_invisible_and_over_half_is_visible():
    before = {"w": np.array([1.0, 1.0, 1.0, 1.0], np.float32)}
    after = {"w": np.array([1.0 + 0.4 * FP16_ULP_AT_1,  # rounds back to 1.0
                            1.0 - 0.2 * FP16_ULP_AT_1,  # rounds back to 1.0
                            1.0 + 0.6 * FP16_ULP_AT_1,  # rounds to the next fp16 value
                            1.0], np.float32)}  # not moved
    assert changed_share(before, after, "fp16") == pytest.approx(1 / 4)
    assert moved_share(before, after) == pytest.approx(3 / 4)
    # bf16's spacing is 8x coarser: the same 0.6 fp16 ulp is less than half a bf16 ulp
    assert changed_share(before, after, "bf16") == 0.0
    # fp32 sees every move
    assert changed_share(before, after, "fp32") == pytest.approx(3 / 4)


def test_visibility_scales_with_the_weight_magnitude():
    """The same step of 1e-6 is visible on a small weight and invisible on a weight of 0.02,
    where the fp16 spacing is 1.5e-5 (the study's case)."""
    base = np.float16([0.02, 1e-4]).astype(np.float32)
    before = {"a": base[:1], "b": base[1:]}
    after = {"a": base[:1] + np.float32(1e-6), "b": base[1:] + np.float32(1e-6)}
    assert np.spacing(np.float16(0.02)) == pytest.approx(1.5e-5, rel=0.03)
    assert changed_share({"a": before["a"]}, {"a": after["a"]}, "fp16") == 0.0
    assert changed_share({"b": before["b"]}, {"b": after["b"]}, "fp16") == 1.0
    assert changed_share(before, after, "fp16") == pytest.approx(0.5)  # counted over all tensors


def test_steps_that_each_round_away_still_add_up():
    """The ratchet: each 0.3-ulp step is invisible alone, but the masters drift until the
    engine's value jumps by a whole ulp."""
    w = {"w": np.array([1.0], np.float32)}
    seen = []
    for _ in range(4):
        new = {"w": w["w"] + np.float32(0.3 * FP16_ULP_AT_1)}
        seen.append(changed_share(w, new, "fp16"))
        w = new
    assert seen == [0.0, 1.0, 0.0, 0.0]  # 0.3, 0.6 (crosses half), 0.9, 1.2 ulp


def test_off_grid_shares():
    on16 = np.float16(np.random.default_rng(0).normal(0, 0.02, 1000)).astype(np.float32)
    assert off_grid_share({"w": on16}, "fp16") == 0.0
    assert off_grid_share({"w": on16}, "fp32") == 0.0
    # fp16 has 10 mantissa bits, bf16 7: most fp16 values (those using the low 3 bits) are off
    # the bf16 grid, and exactly those whose low 3 mantissa bits are zero are on it
    bits = on16.astype(np.float16).view(np.uint16)
    normal = (bits & 0x7C00) != 0
    expected = np.mean(~normal | ((bits & 0x7) != 0))
    share = off_grid_share({"w": on16}, "bf16")
    assert share == pytest.approx(expected, abs=0.02) and share > 0.8
    weights = {"a": np.array([1.0, 1.0 + 2.0 ** -20, 0.5], np.float32),
               "b": np.array([1.0 + FP16_ULP_AT_1, 3.0], np.float32)}
    assert off_grid_share(weights, "fp16") == pytest.approx(1 / 5)
    assert off_grid_share(weights, "bf16") == pytest.approx(2 / 5)


def test_empty_and_shapes():
    assert changed_share({}, {}, "fp16") == 0.0
    assert off_grid_share({}, "fp16") == 0.0
    m = {"w": np.ones((3, 4), np.float32)}
    m2 = {"w": m["w"].copy()}
    m2["w"][1, 2] += np.float32(BF16_ULP_AT_1)
    assert changed_share(m, m2, "bf16") == pytest.approx(1 / 12)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_counting_rounds_exactly_as_the_engine_sync(dtype):
    """The counts use torch's casts; they must round as the engine's conversion does (the
    NumPy reference `round_to`), ties to even and subnormals included."""
    import torch

    from ratchet.mismatch.visibility import _rounded
    from ratchet.model.dtypes import round_to

    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(0, 0.02, 100_000), rng.normal(0, 1e-6, 10_000),
                        np.float16(rng.normal(0, 1, 1000)).astype(np.float32) * (1 + 2.0 ** -11),
                        [0.0, -0.0, 65504.0, 1e-8, -3e-5]]).astype(np.float32)
    ours = _rounded(torch.from_numpy(x), dtype).numpy()
    assert np.array_equal(ours.view(np.uint32), round_to(x, dtype).view(np.uint32))


def _weights(seed: int, step: float = 0.0) -> dict:
    rng = np.random.default_rng(seed)
    base = {"a": rng.standard_normal((7, 5)).astype(np.float32), "b": rng.standard_normal(13).astype(np.float32)}
    return {k: v + np.float32(step) * np.float32(rng.standard_normal(v.shape)) for k, v in base.items()}


def test_shares_count_every_tensor_as_numpy_does():
    """The tensors' counts are summed on their device and read once: the totals NumPy gets."""
    import torch

    before = _weights(0)
    after = _weights(0, step=1e-3)
    after["b"][:4] = before["b"][:4]  # some masters stay put
    cat = lambda d: np.concatenate([v.ravel() for v in d.values()])  # noqa: E731
    b, a = cat(before), cat(after)
    assert moved_share(before, after) == np.count_nonzero(a != b) / a.size
    assert changed_share(before, after, "fp16") == np.count_nonzero(a.astype(np.float16) != b.astype(np.float16)) / a.size
    assert off_grid_share(after, "fp16") == np.count_nonzero(a.astype(np.float16).astype(np.float32) != a) / a.size
    as_torch = {k: torch.from_numpy(v) for k, v in after.items()}  # torch tensors count the same
    assert moved_share(before, as_torch) == moved_share(before, after)
