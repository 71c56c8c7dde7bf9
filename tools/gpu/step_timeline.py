"""The B = 64 decode step as the bench runs it (prompts of 128, 255 steps, then the graph
replayed at context 384), with each kernel's duration, the idle gap before it and its launch
shape (CUPTI through torch.profiler's trace), summed by kernel and by the pair (previous
kernel, kernel). Options change the step before the graphs are captured:

    PYTHONPATH=. python3 tools/gpu/step_timeline.py [split] [carveout=N]

- split: wo and w_down split along K (`CudaBackend.split_products`);
- carveout=N: every engine kernel's preferred shared-memory carveout (0: most L1, 100: most
  shared memory; the driver's default otherwise). An SM changes its L1 / shared split only
  when it is idle, so kernels that prefer different splits may wait on each other.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile


from ratchet.engine.cuda.backend import CudaBackend
from ratchet.engine.cuda.bench import bench_decode, qwen05_config, random_torch_weights

B, PROMPT, NEW = 64, 128, 256
SAMPLER_KERNELS = ("sample",)


def short(name: str) -> str:
    name = name.split("(")[0]
    for key in ("attn_decode_mma", "attn_decode_combine", "add_rmsnorm_warp", "add_rmsnorm", "swiglu",
                "sampler", "embedding", "splitKreduce", "gemv", "gemm", "Kernel"):
        if key in name:
            return key if key not in ("gemm", "Kernel") else name[:48]
    return name[:48]


def timeline(be, steps: int = 5) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    graph = be._graph(B, True, 0)
    be.stream.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            graph.launch(be.stream)
            be.stream.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    rows, prev_end, prev_name = [], None, "(start)"
    for e in kernels:
        a = e.get("args", {})
        gap = 0.0 if prev_end is None else e["ts"] - prev_end
        name = short(e["name"])
        rows.append({"name": name, "prev": prev_name, "dur": e["dur"], "gap": gap,
                     "smem": a.get("shared memory"), "regs": a.get("registers per thread"),
                     "grid": a.get("grid"), "block": a.get("block")})
        prev_end, prev_name = e["ts"] + e["dur"], name
    return rows


def graph_nodes(be) -> dict:
    """Node types of the step's graph, captured again here (CuPy keeps only the executable):
    cudaGraphDebugDotPrint's node labels, counted."""
    import ctypes
    import re

    import cupy as cp

    lib = next(line.split()[-1] for line in open("/proc/self/maps") if "libcudart.so" in line)
    cudart = ctypes.CDLL(lib)
    rt = cp.cuda.runtime
    with be.stream:
        be.stream.synchronize()
        rt.streamBeginCapture(be.stream.ptr, getattr(rt, "streamCaptureModeRelaxed", 2))
        be._decode_body(B, True, 0)
        g = rt.streamEndCapture(be.stream.ptr)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "g.dot").encode()
        err = cudart.cudaGraphDebugDotPrint(ctypes.c_void_p(g), path, ctypes.c_uint(0))
        text = open(path).read() if err == 0 else ""
    rt.graphDestroy(g)
    kinds = collections.Counter(re.findall(r'label="[{<]*\s*([A-Za-z_]+)', text))
    return {"error": err, "kinds": dict(kinds), "edges": text.count("->"), "head": text[:400]}


def set_carveout(be, carve: int) -> int:
    """Every CuPy kernel the backend holds (its own attributes and its helpers', one level down,
    dicts included)."""
    from ratchet.engine.cuda import sampler

    for name in SAMPLER_KERNELS:
        sampler._kernel(name)
    seen, todo = set(), [be, sampler] + [v for v in vars(be).values() if hasattr(v, "__dict__")]
    for obj in todo:
        for v in list(vars(obj).values()) + list(getattr(obj, "_kernels", {}).values()):
            for k in (v.values() if isinstance(v, dict) else [v]):
                if hasattr(k, "preferred_shared_memory_carveout") and id(k) not in seen:
                    k.preferred_shared_memory_carveout = carve
                    seen.add(id(k))
    return len(seen)


def main(args: list[str]) -> None:
    split = "split" in args
    carve = next((int(a.split("=")[1]) for a in args if a.startswith("carveout=")), None)
    cfg = qwen05_config()
    be = CudaBackend(cfg, "fp16", 512, PROMPT + NEW)
    be.split_products = ("wo", "w_down") if split else ("wo",) if "split=wo" in args else \
        ("w_down",) if "split=w_down" in args else ()
    be.load_weights(random_torch_weights(cfg, 0))
    if carve is not None:
        print(f"carveout {carve} set on {set_carveout(be, carve)} kernels")
    res = bench_decode(be, B, PROMPT, NEW, 0)
    rows = timeline(be)
    print("graph nodes:", graph_nodes(be))
    n = len(rows) / 5
    print(f"variant split={split} carveout={carve}: wall {res['step_ms_median (wall, decode_sample)']:.4f} ms, "
          f"replay {res['step_ms_graph_replay (ctx 384)']:.4f} ms, {n:.0f} kernels a step, "
          f"kernels {sum(r['dur'] for r in rows) / 5:.1f} us, gaps {sum(r['gap'] for r in rows[1:]) / 5:.1f} us "
          f"(gaps between steps excluded: {sum(r['gap'] for r in rows[1:] if r['prev'] == 'sampler') / 5:.1f} us)")
    by_kernel = collections.defaultdict(lambda: [0.0, 0.0, 0, None])
    by_pair = collections.defaultdict(lambda: [0.0, 0])
    for r in rows[1:]:
        k = by_kernel[r["name"]]
        k[0] += r["dur"] / 5
        k[1] += r["gap"] / 5
        k[2] += 1
        k[3] = (r["smem"], r["regs"], r["grid"], r["block"])
        if r["prev"] != "sampler":
            p = by_pair[(r["prev"], r["name"])]
            p[0] += r["gap"] / 5
            p[1] += 1
    print("  kernel: us a step, gap before it a step, launches a step, (smem, regs, grid, block)")
    for name, (dur, gap, cnt, shape) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0]):
        print(f"    {dur:8.1f} {gap:7.1f} {cnt / 5:5.0f}  {name:50s} {shape}")
    print("  gap by (previous, kernel): us a step, mean us a gap")
    for (p, k), (gap, cnt) in sorted(by_pair.items(), key=lambda kv: -kv[1][0])[:14]:
        print(f"    {gap:7.1f} {gap / (cnt / 5):6.2f}  {p:30s} -> {k}")


if __name__ == "__main__":
    main(sys.argv[1:])
