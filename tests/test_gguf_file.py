"""ratchet/model/gguf_file.py reads what the `gguf` package's reader reads: every field's value
and type, every tensor's name, type, shape and bytes, on a tiny file of F32, F16 and Q8_0
tensors and (slow, when present) on the real Qwen files; bad bytes are one ValueError."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from test_gguf import write_gguf

from ratchet.model.gguf_file import read_gguf


def assert_same_as_the_package(path):
    ours, ref = read_gguf(path), gguf.GGUFReader(path)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]  # the package's own header entries
    assert list(ours.fields) == keys
    for key in keys:
        field, got = ref.fields[key], ours.fields[key]
        assert ours.types[key] == field.types[0], key
        if isinstance(got, np.ndarray):
            assert np.array_equal(got, np.asarray(field.contents())), key
            assert got.dtype == field.parts[field.data[0]].dtype, key
        else:
            assert got == field.contents() and type(got) is type(field.contents()), key
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ref.tensors, ours.tensors):
        assert (b.tensor_type, b.shape, b.n_elements) == (a.tensor_type, tuple(int(d) for d in a.shape), a.n_elements)
        assert b.data.dtype == a.data.dtype and b.data.shape == a.data.shape, a.name
        assert np.array_equal(b.data, np.asarray(a.data)), a.name
    return ours


def test_a_tiny_file_reads_as_the_package_reads_it(tmp_path):
    write_gguf(tmp_path / "tiny.gguf", "qwen2")
    ours = assert_same_as_the_package(tmp_path / "tiny.gguf")
    kinds = {t.tensor_type for t in ours.tensors}
    assert {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q8_0} <= kinds
    assert isinstance(ours.fields["tokenizer.ggml.tokens"], list) and ours.fields["general.architecture"] == "qwen2"


def test_bad_bytes_are_one_value_error(tmp_path):
    write_gguf(tmp_path / "tiny.gguf", "qwen2")
    data = (tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "magic.gguf").write_bytes(b"GGUX" + data[4:])
    with pytest.raises(ValueError, match="magic"):
        read_gguf(tmp_path / "magic.gguf")
    for keep in (len(data) - 1000, 2000, 30):
        (tmp_path / "cut.gguf").write_bytes(data[:keep])
        with pytest.raises(ValueError):
            read_gguf(tmp_path / "cut.gguf")


@pytest.mark.slow
def test_the_real_05b_file_reads_as_the_package_reads_it(real_gguf):
    assert_same_as_the_package(real_gguf)


@pytest.mark.slow
def test_the_real_15b_file_reads_as_the_package_reads_it(real_gguf_15):
    assert_same_as_the_package(real_gguf_15)
