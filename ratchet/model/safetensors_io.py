"""Reading and writing safetensors files as float32 NumPy arrays, bf16 included.

The `safetensors` package's NumPy API cannot hold bf16, and the engine must not import torch,
so this reads the format directly: an 8-byte little-endian header length, a JSON header of
{name: {dtype, shape, data_offsets}}, then the raw bytes.
"""

from __future__ import annotations

import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ratchet.errors import InputError
from ratchet.model.dtypes import bf16_bits_to_fp32, fp16_values, fp32_to_bf16_bits

_NUMPY = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
          "I32": np.int32, "U8": np.uint8, "I8": np.int8, "BOOL": np.bool_}
_CODE = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}


def storage_code(dtype: str) -> str:
    """The safetensors dtype code an engine dtype is stored as (fp16 -> "F16")."""
    return _CODE[dtype]


def read_header(path: str | Path) -> tuple[dict, int]:
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise InputError(f"{path}: not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            raise InputError(f"{path}: truncated safetensors file (header says {n} bytes)")
        try:
            header = json.loads(f.read(n))
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: corrupt safetensors header: {e}") from None
    header.pop("__metadata__", None)
    data_start = 8 + n
    for name, info in header.items():
        end = info["data_offsets"][1]
        if data_start + end > size:
            raise InputError(f"{path}: truncated safetensors file (tensor {name!r} runs past the end)")
    return header, data_start


def load_fp32(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the file, as float32 (ints are kept as they are).

    One pass per tensor from the mapped file to its float32 copy, tensors on a few threads
    (NumPy's casts release the GIL): 0.6B fp16 weights take ~1 s instead of ~5 s."""

    header, start = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")

    def read(item) -> np.ndarray:
        name, info = item
        a, b = info["data_offsets"]
        raw = data[start + a: start + b]
        shape = tuple(info["shape"])
        code = info["dtype"]
        if code == "BF16":
            return bf16_bits_to_fp32(raw.view(np.uint16)).reshape(shape)
        if code not in _NUMPY:
            raise InputError(f"{path}: tensor {name!r} has unsupported dtype {code}")
        stored = raw.view(_NUMPY[code]).reshape(shape)
        return stored.astype(np.float32 if stored.dtype.kind == "f" else stored.dtype)  # a copy

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return dict(zip(header, pool.map(read, header.items())))


def encode(arr: np.ndarray, dtype: str) -> memoryview:
    """The bytes of `arr` stored in `dtype`, as a view of one contiguous array (no second copy
    of the model's bytes, as `tobytes` made)."""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if dtype == "bf16":
        stored = np.ascontiguousarray(fp32_to_bf16_bits(arr))
    elif dtype == "fp16":
        stored = fp16_values(arr)
    elif dtype == "fp32":
        stored = arr
    else:
        raise InputError(f"unknown dtype {dtype!r}")
    return memoryview(stored.reshape(-1)).cast("B")


def save(path: str | Path, tensors: dict[str, np.ndarray], dtype: str,
         metadata: dict[str, str] | None = None) -> None:
    """Write float tensors in `dtype` (fp32, fp16 or bf16): to a temporary name, then rename."""
    path = Path(path)
    header: dict = {}
    offset = 0
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # NumPy drops the GIL
        blobs = list(pool.map(lambda arr: encode(arr, dtype), tensors.values()))
    for (name, arr), blob in zip(tensors.items(), blobs):
        header[name] = {"dtype": _CODE[dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the format aligns the data to 8 bytes
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)
