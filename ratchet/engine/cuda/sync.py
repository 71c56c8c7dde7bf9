"""In-place weight sync: torch fp32 CUDA tensors (through DLPack, torch never imported) rounded
into the engine's buffers on the GPU in one launch (kernels/convert.cu), bit for bit what
`ratchet.model.dtypes.round_to` gives on the host; a repeated sync of the same tensors
uploads nothing. One DLPack exchange orders CuPy's stream after the producer's."""

from __future__ import annotations

from dataclasses import dataclass

import cupy as cp
import numpy as np

from ratchet.engine.cuda import loader
from ratchet.engine.cuda.ops import STORAGE
from ratchet.engine.cuda.plan import chunk_descriptors
from ratchet.model.layout import coalesce

BUFFER_DTYPES = {np.dtype(v): k for k, v in STORAGE.items()}  # a buffer's dtype -> its engine dtype
MODES = {"fp16": 0, "bf16": 1, "fp32": 2}
BLOCK = 256


@dataclass(frozen=True)
class SyncKernel:
    """Which conversion kernel a sync launches: "search" (convert_many, CHUNK fixed at
    kernels/convert.cu's CONVERT_CHUNK, 4 blocks per multiprocessor) or "table" (convert_table,
    its chunk, resident blocks and load kind template arguments). The grid: at most
    `blocks_per_sm` per multiprocessor (every block resident at once, a grid-stride loop over
    the chunks), or with `per_chunk` one block per chunk (the hardware schedules them). With
    `one_range`, a sync whose tensors coalesce into one range (the trainer's flat masters into
    the engine's flat buffers) runs convert_tiles (`range_loads` > 0) or convert_f32 instead: no
    descriptors to look up at all."""
    name: str = "table"
    chunk: int = 8192
    blocks_per_sm: int = 4
    stream: bool = True
    per_chunk: bool = False
    one_range: bool = False  # a sync that coalesces into one range: convert_f32's grid-stride loop
    range_loads: int = 0  # with one_range: 0 convert_f32, else convert_tiles with this many float4 loads a thread

    def expression(self, mode: int) -> str:
        if self.name == "search":
            return f"convert_many<{mode}>"
        if self.name == "f32":
            return f"convert_f32<{mode}>"
        if self.name == "tiles":
            return f"convert_tiles<{mode}, {self.range_loads}>"
        return f"convert_table<{mode}, {self.chunk}, {self.blocks_per_sm}, {int(self.stream)}>"

    def grid(self, chunks: int, sms: int) -> int:
        return chunks if self.per_chunk else max(1, min(chunks, sms * self.blocks_per_sm))


SEARCH = SyncKernel("search", 8192, 4)
# a sync of several ranges: the fastest table kernel of the sync bench (docs/KERNELS.md, sync run
# 2); one range (the flat layout): convert_tiles with 2 loads a thread, ahead of convert_f32 in the
# same call (sync run 8)
DEFAULT_KERNEL = SyncKernel("table", 8192, 4, stream=False, per_chunk=True, one_range=True, range_loads=2)
ONE_RANGE_BLOCKS_PER_SM = 8  # convert_f32's grid: 2,048 threads a multiprocessor, one float4 each in flight

_kernels: dict = {}
_sms: dict = {}


def is_device_tensor(value) -> bool:
    """A GPU tensor from another framework (torch, ...): it speaks DLPack and is not NumPy."""
    if getattr(value, "is_cuda", None) is True:  # torch: a cheap attribute, no DLPack call
        return hasattr(value, "__dlpack__")
    if isinstance(value, np.ndarray) or not hasattr(value, "__dlpack__"):
        return False
    device = getattr(value, "__dlpack_device__", None)
    return device is not None and device()[0] in (2, 3)  # kDLCUDA, kDLCUDAHost


def _kernel(mode: int, kernel: SyncKernel):
    key = (mode, kernel, cp.cuda.runtime.getDevice())
    fn = _kernels.get(key)
    if fn is None:
        exprs = tuple(dict.fromkeys(loader.expressions("convert") + (kernel.expression(mode),)))
        module = loader.load("convert", exprs)
        fn = _kernels[key] = module.get_function(kernel.expression(mode))
    return fn


def _sm_count() -> int:
    device = cp.cuda.runtime.getDevice()
    n = _sms.get(device)
    if n is None:
        n = _sms[device] = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrMultiProcessorCount, device)
    return n


def _check_buffer(buf: cp.ndarray, dtype: str) -> None:
    if not isinstance(buf, cp.ndarray) or buf.dtype != STORAGE[dtype]:
        raise ValueError(f"sync: engine buffer dtype {getattr(buf, 'dtype', type(buf))} is not the storage of "
                         f"{dtype!r}")
    if not buf.flags.c_contiguous:
        raise ValueError("sync: engine buffers must be C-contiguous")


def _source_pointers(tensors, sizes) -> tuple[list[int], list]:
    """Each source's device pointer (checked: fp32, this device, contiguous, the size), and
    the CuPy views made on the way (kept alive until the launch is queued)."""
    first = tensors[0]
    src0 = cp.from_dlpack(first.detach() if hasattr(first, "detach") else first)  # orders the streams
    device = cp.cuda.runtime.getDevice()
    torch_like = all(hasattr(first, a) for a in ("data_ptr", "is_contiguous", "get_device", "numel", "dtype"))
    f32 = first.dtype if src0.dtype == np.float32 else None
    ptrs, keep = [], [src0]
    for i, (t, n) in enumerate(zip(tensors, sizes)):
        if i and torch_like and hasattr(t, "data_ptr"):
            if t.dtype != f32:
                raise ValueError(f"sync: source dtype {t.dtype}, expected float32")
            if t.get_device() != device:
                raise ValueError(f"sync: source on device {t.get_device()}, engine on {device}")
            if not t.is_contiguous():
                raise ValueError("sync: the source tensor must be contiguous")
            if t.numel() != n:
                raise ValueError(f"sync: source of {t.numel()} values for a buffer of {n}")
            ptrs.append(t.data_ptr())
            continue
        src = src0 if i == 0 else cp.from_dlpack(t.detach() if hasattr(t, "detach") else t)
        if src.dtype != np.float32:
            raise ValueError(f"sync: source dtype {src.dtype}, expected float32")
        if src.device.id != device:
            raise ValueError(f"sync: source on device {src.device.id}, engine on {device}")
        if not src.flags.c_contiguous:
            raise ValueError("sync: the source tensor must be contiguous")
        if src.size != n:
            raise ValueError(f"sync: source of {src.size} values for a buffer of {n}")
        ptrs.append(src.data.ptr)
        if i:
            keep.append(src)
    return ptrs, keep


class _Plan:
    """One set of (source, buffer) pointers, coalesced, ready to launch: a single range for
    convert_f32 (`one_range` kernels), or the descriptor array on the GPU and, for the table
    kernel, each chunk's descriptor index."""

    def __init__(self, kernel: SyncKernel = DEFAULT_KERNEL):
        self.kernel = kernel
        self.key = None
        self.desc = self.table = self.range = None
        self.ndesc = self.chunks = 0

    def launch(self, src_ptrs: list[int], dst_ptrs: tuple[int, ...], sizes: tuple[int, ...], mode: int) -> None:
        key = (tuple(src_ptrs), dst_ptrs)
        if key != self.key:
            self._prepare(*coalesce(src_ptrs, dst_ptrs, sizes, 4 if mode == 2 else 2), mode)
            self.key = key
        if self.range is not None:
            loads = self.kernel.range_loads
            if loads:
                fn = _kernel(mode, SyncKernel("tiles", range_loads=loads))
                fn((-(-int(self.range[2]) // (BLOCK * 4 * loads)),), (BLOCK,), self.range)
            else:
                fn = _kernel(mode, SyncKernel("f32"))
                fn((_sm_count() * ONE_RANGE_BLOCKS_PER_SM,), (BLOCK,), self.range)
        elif self.chunks:
            grid = self.kernel.grid(self.chunks, _sm_count())
            fn = _kernel(mode, self.kernel)
            if self.kernel.name == "table":
                fn((grid,), (BLOCK,), (self.desc, self.table, np.int64(self.chunks)))
            else:
                fn((grid,), (BLOCK,), (self.desc, np.int32(self.ndesc), np.int64(self.chunks)))

    def _prepare(self, src_ptrs: list[int], dst_ptrs: list[int], sizes: list[int], mode: int) -> None:
        self.desc = self.table = self.range = None
        self.ndesc = self.chunks = 0
        if len(sizes) == 1 and self.kernel.one_range and mode != 2:
            self.range = (np.uint64(src_ptrs[0]), np.uint64(dst_ptrs[0]), np.int64(sizes[0]))
            return
        desc, table = chunk_descriptors(src_ptrs, dst_ptrs, sizes, self.kernel.chunk)
        self.desc, self.ndesc, self.chunks = cp.asarray(desc), len(sizes), len(table)
        if self.kernel.name == "table":
            self.table = cp.asarray(table)


class WeightSync:
    """The engine's buffers {name: CuPy array}, checked once; `copy(items)` rounds
    [(name, tensor), ...] into them, one launch on CuPy's current stream."""

    def __init__(self, buffers: dict, dtype: str, kernel: SyncKernel = DEFAULT_KERNEL):
        for buf in buffers.values():
            _check_buffer(buf, dtype)
        self.dtype, self.mode = dtype, MODES[dtype]
        self.dst = {name: (buf.data.ptr, buf.size) for name, buf in buffers.items()}
        self._plan = _Plan(kernel)

    def copy(self, items) -> None:
        """items: [(name, fp32 tensor of the buffer's size)]; shapes are the caller's check."""
        items = [(name, t) for name, t in items if self.dst[name][1]]
        if not items:
            return
        dst = tuple(self.dst[name] for name, _ in items)
        sizes = tuple(n for _, n in dst)
        ptrs, keep = _source_pointers([t for _, t in items], sizes)
        self._plan.launch(ptrs, tuple(p for p, _ in dst), sizes, self.mode)
        del keep  # the launch is queued; the caller holds the tensors


def copy_many(pairs, dtype: str | None = None, kernel: SyncKernel = DEFAULT_KERNEL) -> None:
    """Round each (engine_buffer, tensor) pair's fp32 tensor into its buffer, one launch.

    `dtype` names the buffers' engine dtype (all the same); by default it follows the first
    buffer's storage. Runs on CuPy's current stream, after the producer's stream."""
    pairs = [(b, t) for b, t in pairs if b.size]
    if not pairs:
        return
    dtype = dtype or BUFFER_DTYPES.get(pairs[0][0].dtype)
    if dtype not in MODES:
        raise ValueError(f"copy_many: engine buffer dtype {pairs[0][0].dtype} is not an engine storage")
    for buf, t in pairs:
        _check_buffer(buf, dtype)
        if tuple(t.shape) != tuple(buf.shape):
            raise ValueError(f"copy_many: source shape {tuple(t.shape)} != buffer shape {tuple(buf.shape)}")
    sizes = tuple(b.size for b, _ in pairs)
    ptrs, keep = _source_pointers([t for _, t in pairs], sizes)
    _Plan(kernel).launch(ptrs, tuple(b.data.ptr for b, _ in pairs), sizes, MODES[dtype])
    del keep


def copy_into(engine_buffer: cp.ndarray, tensor, dtype: str | None = None) -> None:
    """Round one `tensor` (fp32, on this GPU, any framework with DLPack) into `engine_buffer`."""
    copy_many([(engine_buffer, tensor)], dtype)
