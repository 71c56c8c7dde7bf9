"""The one-GPU benchmark on Qwen2.5-0.5B shapes (or --shape: Coder-1.5B's, 7B's) with random weights, section by section (one
broken section does not hide the others): decode (B = 64: overlapped as the engine runs it,
plain, graph replay), profile and profile_big (kernels of a B = 64 / 512 step), throughput
(B = 512), engine, hf (transformers beside it), sync, sampler, telemetry (sync/weights_parity's cost).
Medians after warm-up."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from ratchet.atomic import write_text
from ratchet.bench.headline import headline
from ratchet.bench.workload import SHAPES

SECTIONS = ("decode", "profile", "throughput", "profile_big", "engine", "hf", "sync", "sampler", "telemetry")


def bench(batch: int = 64, big_batch: int = 512, prompt_len: int = 128, new_tokens: int = 256,
          hf_new_tokens: int = 32, dtype: str = "fp16", sections=SECTIONS, seed: int = 0,
          shape: str = "qwen2.5-0.5b") -> dict:
    """Each section's figures (or its error); see the module docstring. The hf section runs
    transformers at the 0.5B shapes whatever `shape` is."""
    import cupy as cp

    from ratchet.bench.decode import (
        bench_decode,
        bench_engine,
        bench_throughput,
        profile_decode,
    )
    from ratchet.bench.hf import bench_hf
    from ratchet.bench.sampler import bench_sampler
    from ratchet.bench.sync import bench_sync
    from ratchet.bench.telemetry import bench_telemetry
    from ratchet.bench.workload import random_torch_weights
    from ratchet.engine.cuda import launch
    from ratchet.engine.factory import make_backend

    results: dict = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "dtype": dtype,
                     "shape": shape, "programmatic_dependent_launch": launch.enabled()}
    cfg = SHAPES[shape]()
    backend = weights = None
    if {"decode", "profile", "throughput", "profile_big", "engine", "sync", "telemetry"} & set(sections):
        t = time.perf_counter()
        weights = random_torch_weights(cfg, seed)
        backend = make_backend("cuda", cfg, dtype, max(batch, big_batch), prompt_len + new_tokens)
        backend.load_weights(weights)
        results["setup_s"] = time.perf_counter() - t
    for name in sections:
        t = time.perf_counter()
        try:
            if name == "decode":
                results[name] = bench_decode(backend, batch, prompt_len, new_tokens, seed)
            elif name == "profile":
                results[name] = profile_decode(backend, batch)
            elif name == "throughput":
                results[name] = bench_throughput(backend, big_batch, prompt_len, new_tokens, seed + 1)
            elif name == "profile_big":  # the B=512 step, at the context the throughput run left
                results[name] = profile_decode(backend, big_batch)
            elif name == "engine":
                results[name] = bench_engine(cfg, weights, batch, prompt_len, 64, seed)
            elif name == "hf":
                results[name] = bench_hf(batch, prompt_len, hf_new_tokens, seed)
            elif name == "sync":
                results[name] = bench_sync(backend, weights)
            elif name == "sampler":
                results[name] = bench_sampler(batch, cfg.vocab_size, seed)
            elif name == "telemetry":
                results[name] = bench_telemetry(backend, weights, dtype)
        except Exception as e:  # one broken section must not hide the others
            results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        results.setdefault(name, {})["section_s"] = time.perf_counter() - t
        print(f"[bench] {name}: {json.dumps(results[name], default=float)[:2000]}", flush=True)
    key = "step_ms_median (wall, overlapped as the engine runs)"
    if "decode" in results and "hf" in results and "step_ms" in results["hf"] and key in results["decode"]:
        results["decode_speedup_vs_hf"] = results["hf"]["step_ms"] / results["decode"][key]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--big-batch", type=int, default=512)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="qwen2.5-0.5b")
    args = ap.parse_args()
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        ap.error(f"--sections: {sorted(unknown)} not among {', '.join(SECTIONS)}")
    from ratchet.device import cuda_available

    if not cuda_available():
        sys.exit("ratchet.bench: needs CuPy and a CUDA GPU (it measures the CUDA engine); "
                 "on a GPU machine: pip install 'ratchet[cuda]'")
    res = bench(batch=args.batch, big_batch=args.big_batch, dtype=args.dtype, sections=args.sections.split(","),
                shape=args.shape)
    res["headline"] = headline(res)
    text = json.dumps(res, indent=2, default=float)
    if args.out:
        write_text(Path(args.out), text + "\n")
    print(text)
