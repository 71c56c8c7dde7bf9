"""ratchet's torch dequantisation against the gguf package's NumPy code, bit for bit."""
import gguf
import numpy as np
import pytest

from ratchet.model.dequantize import dequantize_into, huge_page_arrays

TYPES = [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q5_0,
         gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K]


def _random_blocks(qtype, n_blocks, rng):
    """Random bytes for every field, with each fp16 scale finite (NaN payloads may differ)."""
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    starts = {gguf.GGMLQuantizationType.Q4_K: (0, 2), gguf.GGMLQuantizationType.Q6_K: (208,)}.get(qtype, (0,))
    for s in starts:
        raw[:, s:s + 2] = rng.normal(0, 0.05, size=(n_blocks, 1)).astype(np.float16).view(np.uint8)
    raw[:7, starts[0]:starts[0] + 2] = np.array([0.0, -0.0, 6.1e-5, 65504, -65504, 1e-7, 2.0],
                                                dtype=np.float16).view(np.uint8).reshape(7, 2)
    return raw, values


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_each_type_is_the_gguf_packages_bits(qtype):
    rng = np.random.default_rng(int(qtype))
    raw, values = _random_blocks(qtype, 4096, rng)
    rows = raw.reshape(16, -1)  # 16 rows of 256 blocks, as a 2-D tensor's bytes are stored
    want = gguf.quants.dequantize(rows, qtype)
    got = np.full(want.shape, np.nan, dtype=np.float32)
    dequantize_into(rows, qtype, got)
    assert got.shape == (16, 256 * values)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_other_types_go_through_the_gguf_package():
    data = np.arange(12, dtype=np.float16).reshape(3, 4)
    got = np.empty((3, 4), dtype=np.float32)
    dequantize_into(data.view(np.uint8), gguf.GGMLQuantizationType.F16, got)
    np.testing.assert_array_equal(got, data.astype(np.float32))


def test_a_byte_count_that_is_not_the_outputs_says_so():
    raw = np.zeros((2, 34), dtype=np.uint8)
    with pytest.raises(ValueError, match="hold 64 values, not 96"):
        dequantize_into(raw, gguf.GGMLQuantizationType.Q8_0, np.empty((3, 32), dtype=np.float32))


def test_arrays_of_one_mapping_are_apart_and_writable():
    arrays = huge_page_arrays({"a": (3, 5), "b": (7,), "c": (2, 2, 2)})
    assert {k: v.shape for k, v in arrays.items()} == {"a": (3, 5), "b": (7,), "c": (2, 2, 2)}
    for i, a in enumerate(arrays.values()):
        a[...] = i
    assert [float(a.min()) for a in arrays.values()] == [0.0, 1.0, 2.0]
    assert [float(a.max()) for a in arrays.values()] == [0.0, 1.0, 2.0]


def test_a_strided_output_is_refused_not_copied():
    raw = np.zeros((2, 34), dtype=np.uint8)
    out = np.empty((32, 4), dtype=np.float32)[:, :2].T  # 64 values, not contiguous
    with pytest.raises(ValueError, match="not contiguous"):
        dequantize_into(raw, gguf.GGMLQuantizationType.Q8_0, out)
