"""The per-sync telemetry on the GPU, one launch a side (kernels/telemetry.cu, sync_telemetry):
the trainer's fp32 masters rounded as the sync rounds them, the values that changed since
the last sync and those off the grid counted, and the checksums of ratchet/model/checksum.py
formed in the same pass; the engine's buffers checksummed in one launch too. Exact integer
results, equal to the torch and NumPy paths' (tests/test_cuda_weights.py), which took several
passes over the masters and their copies."""

from __future__ import annotations

import cupy as cp
import numpy as np

from ratchet.engine.cuda import loader
from ratchet.engine.cuda.plan import TELEMETRY_CHUNK, chunk_descriptors
from ratchet.engine.cuda.sync import is_device_tensor

MODES = {"fp16": 0, "bf16": 1}  # sync_telemetry<MODE>: masters rounded to this dtype
HELD = 3  # sync_telemetry<3>: 16-bit words already stored, summed only
THREADS = 256

_kernels: dict = {}


def _kernel(mode: int):
    key = (mode, cp.cuda.runtime.getDevice())
    if key not in _kernels:
        exprs = loader.expressions("telemetry")
        _kernels[key] = loader.load("telemetry", exprs).get_function(f"sync_telemetry<{mode}>")
    return _kernels[key]


class Launch:
    """One set of (source, last, size) descriptors on the GPU, kept while the pointers stay."""

    def __init__(self):
        self.key = None

    def run(self, mode: int, src_ptrs: list[int], last_ptrs: list[int], sizes: list[int]):
        """(changed, off grid, [(within, across)] a tensor): one launch, one read-back."""
        key = (tuple(src_ptrs), tuple(last_ptrs), tuple(sizes))
        if key != self.key:
            desc, table = chunk_descriptors(src_ptrs, last_ptrs, sizes, TELEMETRY_CHUNK)
            self.desc, self.table, self.chunks = cp.asarray(desc), cp.asarray(table), len(table)
            self.out = cp.empty(2 * len(sizes) + 2, dtype=np.uint64)  # sums [n, 2], then the two counts
            self.key = key
        self.out.fill(0)
        if self.chunks:
            _kernel(mode)((self.chunks,), (THREADS,),
                          (self.desc, self.table, np.int64(self.chunks), self.out, self.out[-2:]))
        host = cp.asnumpy(self.out).view(np.int64)
        sums = host[:-2].reshape(-1, 2).tolist()
        return int(host[-2]), int(host[-1]), [(int(a), int(b)) for a, b in sums]


class MasterTelemetry:
    """The trainer's side: contiguous fp32 CUDA tensors (torch's surface: data_ptr, numel,
    is_contiguous) under fixed names, and what the engine held after the last sync (16-bit
    values, in a buffer of its own). `held`: those values at the start, as 16-bit words by
    name, when they are not the masters rounded (a resumed engine)."""

    def __init__(self, masters: dict, dtype: str, held: dict | None = None):
        if dtype not in MODES:
            raise ValueError(f"sync telemetry: engine dtype {dtype!r} is not one of {tuple(MODES)}")
        self.mode, self.names = MODES[dtype], list(masters)
        self.sizes = [int(masters[n].numel()) for n in self.names]
        self.device = masters[self.names[0]].get_device()  # the masters' GPU (the trainer's)
        offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int)
        with cp.cuda.Device(self.device):
            self.last = cp.empty(int(offsets[-1]), dtype=np.uint16)
            if held is not None:
                for name, o, n in zip(self.names, offsets, self.sizes):
                    self.last[o:o + n] = _words(held[name])
        self.last_ptrs = [self.last.data.ptr + 2 * int(o) for o in offsets[:-1]]
        self._launch = Launch()
        if held is None:
            self.measure(masters)  # the last held values: the masters rounded

    def measure(self, masters: dict) -> tuple[int, int, dict[str, tuple[int, int]]]:
        """(values whose rounding changed, masters off the grid, checksums by name) of the
        masters as they are now, which become the last held values."""
        tensors = [masters[n] for n in self.names]
        with cp.cuda.Device(self.device):
            ptrs = [_pointer(t, n, name, self.device) for t, n, name in zip(tensors, self.sizes, self.names)]
            keep = cp.from_dlpack(tensors[0].detach())  # orders CuPy's stream after the producer's
            changed, off, sums = self._launch.run(self.mode, ptrs, self.last_ptrs, self.sizes)
            del keep
        return changed, off, dict(zip(self.names, sums))


def buffer_checksums(buffers: list[cp.ndarray], launch: Launch | None = None) -> list[tuple[int, int]]:
    """ratchet.model.checksum.block_checksums of each buffer's 16-bit words, one launch."""
    for b in buffers:
        if not b.flags.c_contiguous or b.dtype.itemsize not in (2, 4):
            raise ValueError(f"buffer_checksums: a contiguous 16- or 32-bit buffer, not {b.dtype} {b.shape}")
    words = [b.size * b.dtype.itemsize // 2 for b in buffers]
    return (launch or Launch()).run(HELD, [b.data.ptr for b in buffers], [0] * len(buffers), words)[2]


def _pointer(t, n: int, name: str, device: int) -> int:
    if str(t.dtype).replace("torch.", "") != "float32" or not t.is_contiguous():
        raise ValueError(f"sync telemetry: {name} must be contiguous float32, not {t.dtype}")
    if t.numel() != n or t.get_device() != device:
        raise ValueError(f"sync telemetry: {name} has {t.numel()} values on device {t.get_device()}, "
                         f"not {n} on device {device}")
    return t.data_ptr()


def _words(value) -> cp.ndarray:
    """A held tensor's 16-bit words, given as an int16 / uint16 array or tensor (DLPack: on this
    GPU or on the host), flattened."""
    words = cp.from_dlpack(value) if is_device_tensor(value) else cp.asarray(np.from_dlpack(value))
    if words.dtype.itemsize != 2:
        raise ValueError(f"sync telemetry: held values as 16-bit words, not {words.dtype}")
    return words.reshape(-1).view(np.uint16)
