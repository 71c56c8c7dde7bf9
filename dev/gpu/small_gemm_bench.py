"""small_gemm.cu alone against cuBLAS (+ swiglu) at a decode bucket's shapes, CUDA events over
graphs of back-to-back launches: each (warps, chunks) split of K, and the cost split into a fixed part
(rows to shared memory, the launch) and a part a tile (tiles = one a block, then all).

    python -m dev.gpu.small_gemm_bench [--k 896] [--inter 4864] [--qkv 1152] [--rows 64]
"""

from __future__ import annotations

import argparse
import json

import cupy as cp
import numpy as np

from ratchet.engine.cuda import loader
from ratchet.engine.cuda.launch import pdl_kernel
from ratchet.engine.cuda.ops import Ops
from ratchet.engine.cuda.plan import small_gemm_smem


def timed(fn, calls: int = 50, reps: int = 20) -> float:
    """Median GPU microseconds a call: `calls` calls captured in one CUDA graph (as the decode
    step runs them, no host launch cost), the graph replayed `reps` times."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(calls):
            fn()
        graph = stream.end_capture()
        for _ in range(3):
            graph.launch(stream)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(reps):
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / calls)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=896)
    ap.add_argument("--inter", type=int, default=4864)
    ap.add_argument("--qkv", type=int, default=1152)
    ap.add_argument("--rows", type=int, default=64)
    args = ap.parse_args()
    k, rows = args.k, args.rows
    ops = Ops("fp16", 64, 7, hidden=k)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal((rows, k)).astype(np.float16))
    wgu = cp.asarray((rng.standard_normal((2 * args.inter, k)) * 0.05).astype(np.float16))
    wq = cp.asarray((rng.standard_normal((args.qkv, k)) * 0.05).astype(np.float16))
    gu = cp.empty((rows, 2 * args.inter), np.float16)
    act = cp.empty((rows, args.inter), np.float16)
    q = cp.empty((rows, args.qkv), np.float32)
    out = {"k": k, "rows": rows, "sms": sms,
           "cublas gate_up + swiglu": timed(lambda: (ops.gemm(x, wgu, gu), ops.swiglu(gu, act))),
           "cublas gate_up": timed(lambda: ops.gemm(x, wgu, gu)),
           "cublas qkv": timed(lambda: ops.gemm(x, wq, q)),
           "small (plan) gate_up + swiglu": timed(lambda: ops.small_gemm(x, wgu, act, swiglu=True)),
           "small (plan) qkv": timed(lambda: ops.small_gemm(x, wq, q))}
    chunks = k // 32
    for warps in range(4, 33):
        if chunks % warps or chunks // warps > 8:
            continue
        cw = chunks // warps
        exprs = (f"small_gemm<F16, {warps}, {cw}, 1, 0>", f"small_gemm<F16, {warps}, {cw}, 2, 1>")
        try:
            module = loader.load("small_gemm", exprs)
        except Exception as e:  # noqa: BLE001 (a variant that does not compile is a row of its own)
            out[f"W={warps} CW={cw}"] = f"{type(e).__name__}: {e}"[:300]
            continue
        for nt8, expr, w, o, n_out in ((1, exprs[0], wq, q, args.qkv), (2, exprs[1], wgu, act, args.inter)):
            raw = module.get_function(expr)
            smem = small_gemm_smem(rows, k, nt8, warps)
            try:
                raw.max_dynamic_shared_size_bytes = small_gemm_smem(64, k, nt8, warps)
            except Exception as e:  # noqa: BLE001
                out[f"W={warps} CW={cw} nt8={nt8}"] = f"{type(e).__name__}: {e}"[:300]
                continue
            fn = pdl_kernel(raw)
            tiles = n_out // 8
            for used in sorted({tiles, min(tiles, sms)}):  # one tile a block, then all of them

                def call(fn=fn, used=used, w=w, o=o, n_out=n_out):
                    fn((min(used, sms),), (32 * warps,), (x, w, o, np.int32(rows), np.int32(n_out), np.int32(used)),
                       shared_mem=smem)

                out[f"W={warps} CW={cw} {'swiglu' if nt8 == 2 else 'qkv'} tiles={used}"] = timed(call)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
