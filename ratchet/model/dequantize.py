"""GGUF block dequantisation in torch for the types Qwen2.5's GGUF files use (Q8_0, Q5_0,
Q4_K, Q6_K); any other type through the `gguf` package's NumPy code.

Why: gguf.quants allocates a full-size temporary at every step, so it runs at 50-240 M
values/s on one core and a thread pool only adds page faults; torch's CPU kernels do the same
element-wise arithmetic vectorised on every core. Each value comes out of the same float32
operations in the same order as gguf.quants (int to float is exact; one product, and for Q4_K
a product then a difference, each rounded once), so the bits are the same:
tests/test_dequantize.py compares every type on random blocks and the converted real model's
manifest is unchanged.
"""
from __future__ import annotations

import contextlib
import mmap
import warnings

import gguf
import numpy as np
import torch


def dequantize_into(data: np.ndarray, qtype: gguf.GGMLQuantizationType, out: np.ndarray) -> None:
    """The float32 values of a tensor's raw GGUF bytes `data`, written into `out` (its shape)."""
    kernel = _KERNELS.get(qtype)
    if kernel is None:
        out[...] = gguf.quants.dequantize(data, qtype).reshape(out.shape)
        return
    if not out.flags.c_contiguous:  # its flat view is written, never a copy of it
        raise ValueError(f"the output of shape {out.shape} is not contiguous")
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if raw.size * block_values != out.size * block_bytes:
        raise ValueError(f"{raw.size} bytes of {qtype.name} hold {raw.size // block_bytes * block_values} "
                         f"values, not {out.size}")
    with warnings.catch_warnings():  # a read-only memory map: torch warns, and nothing writes to it
        warnings.simplefilter("ignore", UserWarning)
        blocks = torch.from_numpy(raw).view(-1, block_bytes)
    kernel(blocks, torch.from_numpy(out.reshape(-1)).view(-1, block_values))


def huge_page_arrays(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Empty float32 arrays of these shapes in one anonymous mapping that asks the kernel for
    2 MiB pages: the first write to gigabytes of fresh memory costs a page fault per page,
    which at 4 KiB took most of the dequantisation's time (measured on the CPU machine)."""
    sizes = {name: int(np.prod(shape, dtype=np.int64)) * 4 for name, shape in shapes.items()}
    buffer = mmap.mmap(-1, max(1, sum(-(-n // 64) * 64 for n in sizes.values())))
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or no transparent huge pages
        buffer.madvise(mmap.MADV_HUGEPAGE)
    arrays, offset = {}, 0
    for name, shape in shapes.items():
        arrays[name] = np.frombuffer(buffer, np.float32, sizes[name] // 4, offset).reshape(shape)
        offset += -(-sizes[name] // 64) * 64
    return arrays


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 field at byte `start` of every block as float32, [blocks, 1]."""
    return blocks[:, start:start + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor, groups: int) -> torch.Tensor:
    """[blocks, groups * 2, width]: each group's low nibbles, then its high nibbles (ggml's order)."""
    packed = packed.reshape(packed.shape[0], groups, 1, -1)
    return torch.cat([packed & 0x0F, packed >> 4], dim=2).reshape(packed.shape[0], groups * 2, -1)


def _q8_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    torch.mul(blocks[:, 2:].view(torch.int8), _f16(blocks, 0), out=out)


def _q5_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    n = blocks.shape[0]
    bits = blocks[:, 2:6].reshape(n, 4, 1) >> torch.arange(8, dtype=torch.uint8)  # bit j of the
    high = (bits & 1).reshape(n, 32) << 4  # little-endian uint32 is bit j % 8 of its byte j // 8
    q = (_nibbles(blocks[:, 6:22], 1).reshape(n, 32) | high).view(torch.int8) - 16
    torch.mul(q, _f16(blocks, 0), out=out)


def _q4_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    n = blocks.shape[0]
    scales = blocks[:, 4:16].reshape(n, 3, 4)
    d, m, m_d = scales[:, 0], scales[:, 1], scales[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mins = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=1)
    scale = (_f16(blocks, 0) * sc.float()).unsqueeze(-1)  # [n, 8, 1]
    offset = (_f16(blocks, 2) * mins.float()).unsqueeze(-1)
    out = out.view(n, 8, 32)
    torch.mul(scale, _nibbles(blocks[:, 16:144], 4), out=out)  # then the offset: two roundings, as gguf's
    out.sub_(offset)


def _q6_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    n = blocks.shape[0]
    low = _nibbles(blocks[:, :128], 2)  # [n, 4, 64] -> [n, 8, 32]
    low = low.reshape(n, 8, 32)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    high = (qh & 0x03).reshape(n, 8, 32)
    q = ((low | (high << 4)).view(torch.int8) - 32).reshape(n, 16, 16)
    scale = (_f16(blocks, 208) * blocks[:, 192:208].view(torch.int8).float()).unsqueeze(-1)  # [n, 16, 1]
    torch.mul(scale, q, out=out.view(n, 16, 16))


_KERNELS = {
    gguf.GGMLQuantizationType.Q8_0: _q8_0,
    gguf.GGMLQuantizationType.Q5_0: _q5_0,
    gguf.GGMLQuantizationType.Q4_K: _q4_k,
    gguf.GGMLQuantizationType.Q6_K: _q6_k,
}
