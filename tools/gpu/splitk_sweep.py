"""The decode step's matrix products at B = 64 with K split over a strided batch: cuBLAS's own
choice (`ops.gemm`, what the step runs) against `cublasGemmStridedBatchedEx` computing S
partial products in fp32 (the sum of the S partials then belongs to the next kernel, which
reads its input anyway). The 24 layers' weights are used in turn, as in a decode step, so
the weights come from HBM, not L2; each figure is a launch's share of a CUDA graph of all 24.

    PYTHONPATH=. python3 tools/gpu/splitk_sweep.py
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from lt_sweep import graph_time  # the script's own folder (tools/gpu) is on sys.path

from ratchet.engine.cuda.ops import Ops

LAYERS = 24
SHAPES = {"qkv": (1152, 896, np.float32), "wo": (896, 896, np.float16), "gate_up": (9728, 896, np.float16),
          "down": (896, 4864, np.float16)}


def per_product_us(fn, stream) -> float:
    """Microseconds of one of the LAYERS products fn launches (a graph of fn, replayed)."""
    return graph_time(fn, stream, reps=1) / LAYERS


def splits_of(k: int) -> list[int]:
    return [s for s in (2, 3, 4, 6, 7, 8, 12, 14, 16, 19) if k % s == 0 and (k // s) % 8 == 0]


def main(rows: int = 64) -> None:
    ops = Ops("fp16", 64, 7)
    stream = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    for name, (n, k, out_t) in SHAPES.items():
        ws = [cp.asarray((rng.standard_normal((n, k)) * 0.03).astype(np.float16)) for _ in range(LAYERS)]
        x = cp.asarray(rng.standard_normal((rows, k)).astype(np.float16))
        out = cp.empty((rows, n), out_t)
        base = per_product_us(lambda: [ops.gemm(x, w, out) for w in ws], stream)
        with stream:
            ops.gemm(x, ws[0], out)
            ref = out.astype(np.float32)
        mb = n * k * 2 / 1e6
        line = [f"B{rows} {name:8s} {mb:5.1f} MB  gemmEx {base:6.2f} us ({mb / base:.2f} TB/s)"]
        for s in splits_of(k):
            parts = cp.empty((s, rows, n), np.float32)
            t = per_product_us(lambda: [ops.gemm_split(x, w, parts) for w in ws], stream)
            with stream:
                ops.gemm_split(x, ws[0], parts)
                diff = float(cp.abs(parts.sum(0) - ref).max())
            line.append(f"S{s} {t:6.2f} ({mb / t:.2f} TB/s, d {diff:.1g})")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
