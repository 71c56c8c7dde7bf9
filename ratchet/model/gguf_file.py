"""A GGUF file's metadata and tensor table, read straight from its bytes. The `gguf` package's
reader makes a NumPy view for every part of every field, ~450,000 of them for a Qwen file's
vocabulary and merges, and takes seconds to tens of seconds a parse; this reads the same
fields with `struct` and the tensors as views of one memory map, in a fraction of a second.
The tensors' data are what `gguf.quants.dequantize` takes, as from the package's reader."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
)
from gguf.quants import quant_shape_to_byte_shape

VERSIONS = (2, 3)
_SCALAR = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
           GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
           GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
           GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
# ggml types whose data are plain numbers (the others are blocks of bytes)
_PLAIN = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
          GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
          GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
          GGMLQuantizationType.I64: np.int64}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml's order, the fastest axis first (as gguf's ReaderTensor.shape)
    n_elements: int
    data: np.ndarray  # numbers for plain types, else uint8 rows of blocks (as ReaderTensor.data)


@dataclass
class GGUFFile:
    fields: dict[str, Any]  # scalars and strings as Python values; arrays as lists or NumPy arrays
    types: dict[str, GGUFValueType]  # each field's type (ARRAY for arrays)
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buffer):
        self.buffer, self.at = buffer, 0

    def take(self, fmt: str):
        value = struct.unpack_from(fmt, self.buffer, self.at)
        self.at += struct.calcsize(fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("<Q")
        text = bytes(self.buffer[self.at:self.at + n]).decode("utf-8")
        self.at += n
        return text

    def value(self, kind: GGUFValueType):
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            item, count = GGUFValueType(self.take("<I")), self.take("<Q")
            if item == GGUFValueType.STRING:
                return [self.string() for _ in range(count)]
            if item == GGUFValueType.ARRAY:
                return [self.value(GGUFValueType(self.take("<I"))) for _ in range(count)]
            dtype = np.dtype("<" + _SCALAR[item])
            out = np.frombuffer(self.buffer, dtype, count, self.at).copy()
            self.at += dtype.itemsize * count
            return out
        return self.take("<" + _SCALAR[kind])


def read_gguf(path: str | Path) -> GGUFFile:
    """The fields and tensors of a little-endian GGUF file (versions 2 and 3); ValueError on
    anything else, or on bytes that end before the header says they do."""
    path = Path(path)
    with open(path, "rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(buffer)
    except (struct.error, UnicodeDecodeError, IndexError) as e:
        raise ValueError(f"truncated or corrupt header ({type(e).__name__}: {e})") from None


def _parse(buffer) -> GGUFFile:
    cur = _Cursor(buffer)
    if len(buffer) < 24 or cur.take("<I") != GGUF_MAGIC:
        raise ValueError("GGUF magic invalid")
    version = cur.take("<I")
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version} (or a big-endian file) is not supported; read "
                         f"versions {VERSIONS}, little-endian")
    tensor_count, kv_count = cur.take("<Q"), cur.take("<Q")
    fields, types = {}, {}
    for _ in range(kv_count):
        key, kind = cur.string(), GGUFValueType(cur.take("<I"))
        fields[key], types[key] = cur.value(kind), kind
    table = []
    for _ in range(tensor_count):
        name, n_dims = cur.string(), cur.take("<I")
        dims = struct.unpack_from(f"<{n_dims}Q", buffer, cur.at)
        cur.at += 8 * n_dims
        table.append((name, dims, GGMLQuantizationType(cur.take("<I")), cur.take("<Q")))
    alignment = int(fields.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"invalid general.alignment {alignment}: must be a power of two")
    start = -(-cur.at // alignment) * alignment
    data = np.frombuffer(buffer, np.uint8)
    tensors, seen = [], set()
    for name, dims, kind, offset in table:
        if name in seen:
            raise ValueError(f"duplicated tensor {name!r}")
        seen.add(name)
        n_elements = int(np.prod(dims))
        block, type_size = GGML_QUANT_SIZES[kind]
        n_bytes = n_elements * type_size // block
        begin = start + offset
        if begin + n_bytes > data.size:
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        np_dims = tuple(reversed(dims))
        raw = data[begin:begin + n_bytes]
        if kind in _PLAIN:
            values = raw.view(_PLAIN[kind]).reshape(np_dims)
        else:
            values = raw.reshape(quant_shape_to_byte_shape(np_dims, kind))
        tensors.append(GGUFTensor(name, kind, tuple(int(d) for d in dims), n_elements, values))
    return GGUFFile(fields, types, tensors)
