"""Kernel launches with programmatic dependent launch (PDL, compute capability 9.0+): a kernel's
blocks may be scheduled while the previous kernel drains, and wait inside it (every kernel
starts with `pdl_begin()`, dtype.cuh), so the bits are the same and only the gaps between
kernels shrink. On where the driver has cuLaunchKernelEx, unless RATCHET_PDL=0."""

from __future__ import annotations

import ctypes
import os

import cupy as cp
import numpy as np

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID
_CTYPE = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
          np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
          np.dtype(np.float32): ctypes.c_float}


class _Attribute(ctypes.Structure):  # CUlaunchAttribute: id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]


_driver = None  # libcuda's cuLaunchKernelEx, or False where PDL is off


def _launch_ex():
    global _driver
    if _driver is None:
        _driver = False
        if os.environ.get("RATCHET_PDL", "1") != "0":
            major = cp.cuda.Device().compute_capability  # "90" for sm_90
            if int(major) >= 90:
                try:
                    fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
                    fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
                    fn.restype = ctypes.c_int
                    _driver = fn
                except (OSError, AttributeError):
                    pass
    return _driver


def enabled() -> bool:
    return bool(_launch_ex())


def _c_arg(a):
    if isinstance(a, cp.ndarray):
        return ctypes.c_uint64(a.data.ptr)
    if isinstance(a, np.generic) and a.dtype in _CTYPE:
        return _CTYPE[a.dtype](a.item())
    raise TypeError(f"pdl launch: argument of type {type(a).__name__} ({getattr(a, 'dtype', '')}); pass a cupy "
                    "array or a NumPy scalar of the kernel's C type")


def _dims(d) -> tuple[int, int, int]:
    d = tuple(int(x) for x in (d if isinstance(d, tuple) else (d,)))
    return d + (1,) * (3 - len(d))


def pdl_kernel(raw):
    """`raw` (a CuPy RawKernel) launched with PDL where it is on; as `raw` itself otherwise."""
    launch_ex = _launch_ex()
    if not launch_ex:
        return raw
    func = raw.kernel.ptr  # the CUfunction (loads the module on the current device)
    attr = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1

    def launch(grid, block, args, shared_mem: int = 0) -> None:
        values = [_c_arg(a) for a in args]
        params = (ctypes.c_void_p * len(values))(*(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values))
        cfg = _Config(grid=(ctypes.c_uint * 3)(*_dims(grid)), block=(ctypes.c_uint * 3)(*_dims(block)),
                      shared_mem=int(shared_mem), stream=cp.cuda.get_current_stream().ptr,
                      attrs=ctypes.pointer(attr), num_attrs=1)
        status = launch_ex(ctypes.byref(cfg), func, params, None)
        if status != 0:
            raise RuntimeError(f"cuLaunchKernelEx ({raw.name}) failed with CUDA error {status}")

    return launch
