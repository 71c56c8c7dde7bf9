"""The cuBLAS binding: CuPy's own wrapper refuses to run while a stream is being captured,
so the matrix products call cuBLAS (which supports capture) through ctypes, from the
library CuPy loaded."""

from __future__ import annotations

import ctypes

import cupy as cp
import numpy as np

CUDA_R = {"fp32": 0, "fp16": 2, "bf16": 14}  # cudaDataType: CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68  # fp32 accumulation, no TF32
CUBLAS_GEMM_DEFAULT = -1


class CublasError(RuntimeError):
    pass


def _load_libcublas() -> ctypes.CDLL:
    """The libcublas CuPy loaded (found by cuda.pathfinder), opened again through ctypes."""
    from cupy_backends.cuda.libs import cublas  # noqa: F401  (makes CuPy load the library)

    names = []
    try:
        from cuda import pathfinder

        loaded = pathfinder.load_nvidia_dynamic_lib("cublas")
        if loaded.abs_path:
            names.append(loaded.abs_path)
    except Exception:  # older CuPy: the library is loaded under its soname
        pass
    names += ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    errors = []
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            lib.cublasGemmEx  # noqa: B018
            return lib
        except (OSError, AttributeError) as e:
            errors.append(f"{name}: {e}")
    raise CublasError("cannot open libcublas: " + "; ".join(errors))


class Cublas:
    """One cuBLAS handle with its own 32 MiB workspace (no allocation inside a capture)."""

    WORKSPACE_BYTES = 32 << 20

    def __init__(self):
        lib = self.lib = _load_libcublas()
        vp, i = ctypes.c_void_p, ctypes.c_int
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
        lib.cublasDestroy_v2.argtypes = [vp]
        lib.cublasSetStream_v2.argtypes = [vp, vp]
        lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
        lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
        ll = ctypes.c_longlong
        lib.cublasGemmStridedBatchedEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i,
                                                   ll, i, i, i]
        handle = vp()
        self._check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = handle
        self.workspace = cp.empty(self.WORKSPACE_BYTES, dtype=np.uint8)
        self._stream = None

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CublasError(f"{what} failed with cuBLAS status {status}")

    def set_stream(self, stream_ptr: int) -> None:
        if stream_ptr != self._stream:  # setStream also resets the workspace: set it again
            self._check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream")
            self._check(self.lib.cublasSetWorkspace_v2(self.handle, ctypes.c_void_p(self.workspace.data.ptr),
                                                       self.WORKSPACE_BYTES), "cublasSetWorkspace")
            self._stream = stream_ptr

    def gemm_ex(self, transa, transb, m, n, k, alpha_ptr, a_ptr, a_type, lda, b_ptr, b_type, ldb, beta_ptr,
                c_ptr, c_type, ldc, compute, algo) -> None:
        self._check(self.lib.cublasGemmEx(self.handle, transa, transb, m, n, k, alpha_ptr, a_ptr, a_type, lda,
                                          b_ptr, b_type, ldb, beta_ptr, c_ptr, c_type, ldc, compute, algo),
                    "cublasGemmEx")

    def gemm_strided_batched_ex(self, transa, transb, m, n, k, alpha_ptr, a_ptr, a_type, lda, stride_a, b_ptr,
                                b_type, ldb, stride_b, beta_ptr, c_ptr, c_type, ldc, stride_c, count, compute,
                                algo) -> None:
        self._check(self.lib.cublasGemmStridedBatchedEx(self.handle, transa, transb, m, n, k, alpha_ptr, a_ptr,
                                                        a_type, lda, stride_a, b_ptr, b_type, ldb, stride_b,
                                                        beta_ptr, c_ptr, c_type, ldc, stride_c, count, compute,
                                                        algo), "cublasGemmStridedBatchedEx")

    def close(self) -> None:
        if self.handle is not None:
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = None
