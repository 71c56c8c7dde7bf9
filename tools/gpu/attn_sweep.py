"""Decode attention alone on Qwen2.5-0.5B shapes (24 layers' worth of launches timed as one):
the CUDA-core kernel against attn_decode_mma at several split targets, and their outputs.

    PYTHONPATH=. python3 tools/gpu/attn_sweep.py [--dtype fp16]
"""

from __future__ import annotations

import argparse
import json

import cupy as cp
import numpy as np

from ratchet.engine.cuda import ops as ops_mod
from ratchet.engine.cuda import plan as plan_mod
from ratchet.engine.cuda.bench import Events


def run(dtype: str, batch: int, max_seq: int, lo: int, hi: int, settings) -> dict:
    o = ops_mod.Ops(dtype, 64, 7)
    kv, g, hd = 2, 7, 64
    rng = np.random.default_rng(0)
    storage = o.storage
    cache = cp.asarray((rng.standard_normal((batch + 1, 2, kv, max_seq, hd)) * 0.5).astype(np.float32))
    cache = cache.astype(np.float16) if dtype == "fp16" else (cache.view(np.uint32) >> 16).astype(np.uint16)
    q = cp.asarray((rng.standard_normal((batch, kv * g * hd))).astype(np.float32))
    q = q.astype(np.float16) if dtype == "fp16" else (q.view(np.uint32) >> 16).astype(np.uint16)
    slots = cp.arange(batch, dtype=np.int32)
    seq_lens = cp.asarray(rng.integers(lo, hi + 1, batch).astype(np.int32))
    _, nsplit = plan_mod.decode_split(max_seq)
    part_acc = cp.empty((batch, kv, nsplit, g, hd), np.float32)
    part_ml = cp.empty((batch, kv, nsplit, g, 2), np.float32)
    outs, res = {}, {}
    stream = cp.cuda.get_current_stream()
    defaults = {k: getattr(plan_mod, k) for k in ("MMA_MAX_WARPS", "MMA_WARPS_MANY_ROWS", "MMA_TARGET_BLOCKS")}
    for name in ["cuda-core"] + [json.dumps(x) for x in settings]:
        if name == "cuda-core":
            f, o.f_decode_mma = o.f_decode_mma, None
        else:
            for k, v in {**defaults, **json.loads(name)}.items():
                setattr(plan_mod, k, v)
        out = cp.zeros((batch, kv * g * hd), storage)
        ev = Events()
        for i in range(25):
            with ev.time(stream):
                for _ in range(24):
                    o.attention_decode(q, cache, slots, seq_lens, part_acc, part_ml, out)
        if name == "cuda-core":
            o.f_decode_mma = f
        outs[name] = cp.asnumpy(out.view(np.uint16))
        split = plan_mod.mma_decode_plan(batch, kv, max_seq, hd, g, nsplit) if name != "cuda-core" else None
        res[name] = {"us_per_layer": 1e3 * float(np.median(ev.ms[5:])) / 24, "split": split}
    ref = outs["cuda-core"]
    to_f = (lambda a: a.view(np.float16).astype(np.float32)) if dtype == "fp16" else \
        (lambda a: (a.astype(np.uint32) << 16).view(np.float32))
    for name, a in outs.items():
        d = np.abs(to_f(a) - to_f(ref))
        res[name]["max_diff_vs_cuda_core"] = float(d.max())
        res[name]["share_bits_equal"] = float((a == ref).mean())
    for k, v in defaults.items():
        setattr(plan_mod, k, v)
    kv_bytes = float(cp.asnumpy(seq_lens).sum()) * kv * 2 * hd * storage.itemsize
    for r in res.values():
        r["TBps"] = kv_bytes / (r["us_per_layer"] * 1e-6) / 1e12
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp16")
    args = ap.parse_args()
    out = {"B64 ctx 128..384": run(args.dtype, 64, 384, 128, 384,
                                   [{"MMA_MAX_WARPS": w} for w in (4, 8, 12, 16)]
                                   + [{"MMA_MAX_WARPS": 4, "MMA_TARGET_BLOCKS": 528}]),
           "B64 ctx 384": run(args.dtype, 64, 384, 384, 384, [{"MMA_MAX_WARPS": w} for w in (4, 12)]),
           "B512 ctx 128..384": run(args.dtype, 512, 384, 128, 384,
                                    [{"MMA_WARPS_MANY_ROWS": w} for w in (2, 4, 8)]),
           "B8 ctx 1000..4000": run(args.dtype, 8, 4096, 1000, 4000, [{}, {"MMA_MAX_WARPS": 8}])}
    for case, res in out.items():
        for name, r in res.items():
            print(f"{case:18s} {name:45s} {r['us_per_layer']:7.2f} us {r['TBps']:5.2f} TB/s split {r['split']} "
                  f"maxdiff {r['max_diff_vs_cuda_core']:.3g} equal {r['share_bits_equal']:.4f}")
