"""The decode step's matrix products at B = 64 and 512 (Qwen2.5-0.5B shapes): cublasGemmEx's
choice (what ops.gemm runs) against every algorithm cuBLASLt's heuristic offers, each timed
as 20 launches captured in a CUDA graph (no Python in the timing).

    PYTHONPATH=. python3 tools/gpu/lt_sweep.py
"""

from __future__ import annotations

import ctypes

import cupy as cp
import numpy as np

from ratchet.engine.cuda.bench import Events
from ratchet.engine.cuda.ops import CUBLAS_COMPUTE_32F, CUDA_R, Ops

TRANSA, TRANSB, PREF_MAX_WORKSPACE = 3, 4, 1
R_32F = 0


def _lib():
    names = []
    try:
        from cuda import pathfinder

        names.append(pathfinder.load_nvidia_dynamic_lib("cublasLt").abs_path)
    except Exception as e:  # noqa: BLE001
        print("pathfinder:", e)
    for n in names + ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    raise RuntimeError("no libcublasLt")


class HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def ok(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: cublas status {status}")


class Lt:
    def __init__(self):
        self.lib = lib = _lib()
        vp = ctypes.c_void_p
        self.handle = vp()
        ok(lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.ws = cp.empty(32 << 20, np.uint8)
        lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_uint64,
                                                   ctypes.c_uint64, ctypes.c_int64]
        lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_int]
        lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, ctypes.c_int, vp, ctypes.c_size_t]
        lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, ctypes.c_int, vp, ctypes.c_size_t]
        lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, ctypes.c_int,
                                                       ctypes.POINTER(HeuristicResult), ctypes.POINTER(ctypes.c_int)]
        lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.c_size_t, vp]

    def layout(self, dtype, rows, cols, ld):
        p = ctypes.c_void_p()
        ok(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(p), dtype, rows, cols, ld), "layout")
        return p

    def plan(self, dt_in, dt_out, n, rows, k, count=32):
        desc = ctypes.c_void_p()
        ok(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, R_32F), "desc")
        t, nn = ctypes.c_int(1), ctypes.c_int(0)
        ok(self.lib.cublasLtMatmulDescSetAttribute(desc, TRANSA, ctypes.byref(t), 4), "transa")
        ok(self.lib.cublasLtMatmulDescSetAttribute(desc, TRANSB, ctypes.byref(nn), 4), "transb")
        a = self.layout(dt_in, k, n, k)      # W [n, k] row-major = [k, n] column-major, op T
        b = self.layout(dt_in, k, rows, k)   # X [rows, k] row-major = [k, rows] column-major
        c = self.layout(dt_out, n, rows, n)  # out [rows, n] row-major = [n, rows] column-major
        pref = ctypes.c_void_p()
        ok(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
        wsz = ctypes.c_uint64(self.ws.nbytes)
        ok(self.lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(wsz), 8), "pref ws")
        results = (HeuristicResult * count)()
        got = ctypes.c_int()
        ok(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, a, b, c, c, pref, count, results,
                                                   ctypes.byref(got)), "heuristic")
        return desc, a, b, c, [results[i] for i in range(got.value) if results[i].state == 0]

    def matmul(self, plan, algo, w, x, out, stream):
        desc, a, b, c, _ = plan
        one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        ok(self.lib.cublasLtMatmul(self.handle, desc, one.ctypes.data, w.data.ptr, a, x.data.ptr, b,
                                   zero.ctypes.data, out.data.ptr, c, out.data.ptr, c, ctypes.byref(algo.algo),
                                   self.ws.data.ptr, algo.workspace, stream.ptr), "matmul")


def graph_time(fn, stream, reps=20):
    with stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(reps):
            fn()
        g = stream.end_capture()
    g.launch(stream)
    stream.synchronize()
    ev = Events()
    for _ in range(10):
        with ev.time(stream):
            g.launch(stream)
    return 1e3 * float(np.median(ev.ms)) / reps


def output_dtype_sweep(ops, stream, rows=64, layers=24):
    """cublasGemmEx with fp16 against fp32 output (the rounding moved to the next kernel), the
    weights of 24 layers in turn as in a decode step (so they are not all in L2)."""
    rng = np.random.default_rng(1)
    for name, (n, k) in {"qkv": (1152, 896), "wo": (896, 896), "down": (896, 4864)}.items():
        ws = [cp.asarray((rng.standard_normal((n, k)) * 0.03).astype(np.float16)) for _ in range(layers)]
        x = cp.asarray(rng.standard_normal((rows, k)).astype(np.float16))
        line = []
        for out_t in (np.float16, np.float32):
            out = cp.empty((rows, n), out_t)

            def run():
                for w in ws:
                    ops.gemm(x, w, out)
            line.append(graph_time(run, stream, reps=1) / layers)
        print(f"B{rows} {name:5s} rotating {layers} weights: fp16 out {line[0]:.2f} us, fp32 out {line[1]:.2f} us")


def main():
    ops = Ops("fp16", 64, 7)
    lt = Lt()
    stream = cp.cuda.Stream(non_blocking=True)
    shapes = {"qkv": (1152, 896, "fp32"), "wo": (896, 896, "fp16"), "gate_up": (9728, 896, "fp16"),
              "down": (896, 4864, "fp16"), "head": (151936, 896, "fp32")}
    output_dtype_sweep(ops, stream)
    rng = np.random.default_rng(0)
    for rows in (64, 512):
        for name, (n, k, odt) in shapes.items():
            w = cp.asarray((rng.standard_normal((n, k)) * 0.03).astype(np.float16))
            x = cp.asarray(rng.standard_normal((rows, k)).astype(np.float16))
            out_t = np.float32 if odt == "fp32" else np.float16
            out = cp.empty((rows, n), out_t)
            base = graph_time(lambda: ops.gemm(x, w, out), stream)
            ref = out.astype(np.float32).copy()
            plan = lt.plan(CUDA_R["fp16"], CUDA_R[odt], n, rows, k)
            times = []
            for i, algo in enumerate(plan[4]):
                try:
                    t = graph_time(lambda: lt.matmul(plan, algo, w, x, out, stream), stream)
                except Exception as e:  # noqa: BLE001
                    times.append((i, None, str(e)[:40]))
                    continue
                diff = float(cp.abs(out.astype(np.float32) - ref).max())
                times.append((i, t, f"ws {algo.workspace >> 10} KiB waves {algo.waves:.2f} maxdiff {diff:.2g}"))
            best = min((t for t in times if t[1] is not None), key=lambda t: t[1], default=None)
            mb = (n * k * 2) / 1e6
            print(f"B{rows:<4d} {name:8s} {mb:6.1f} MB  gemmEx {base:7.2f} us ({mb / base:.2f} TB/s)  "
                  f"lt[0] {times[0][1] if times else None}  best {best}  n_algos {len(times)}")


if __name__ == "__main__":
    main()
