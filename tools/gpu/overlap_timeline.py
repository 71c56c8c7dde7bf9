"""B = 64 decode steps plain (`decode_sample`, each waited for) and overlapped (step t + 1
launched, its tokens fed on the GPU, before step t is read), as the bench runs them (prompts
of 128), with each mode's per-step wall and its GPU timeline (CUPTI through torch.profiler):
kernel time a step, the idle gap between steps, the copies.

    PYTHONPATH=. python3 tools/gpu/overlap_timeline.py

(Two graphs a bucket alternated, so that a graph is never launched while its previous launch
may still run, made no difference; the backend now keeps one a pinned buffer pair anyway.)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np

from ratchet.engine.cuda.backend import CudaBackend
from ratchet.engine.cuda.bench import _generate, qwen05_config, random_torch_weights

B, PROMPT, STEPS = 64, 128, 40


def steps(be, overlap: bool, n: int, start: int) -> list[float]:
    slots, ones, falses, seeds = list(range(B)), [1.0] * B, [False] * B, [0] * B
    tokens = list(range(B))
    wall, pending = [], None
    t = time.perf_counter()
    for i in range(n):
        pos = [start + i] * B
        if overlap:
            nxt = be.decode_sample_async(slots, tokens, pos, seeds, slots, [start + i] * B, ones, falses,
                                         feed=None if pending is None else slots)
            if pending is not None:
                pending.result()
            pending = nxt
        else:
            tokens = be.decode_sample(slots, tokens, pos, seeds, slots, [start + i] * B, ones, falses)[0]
        now = time.perf_counter()
        wall.append(now - t)
        t = now
    if pending is not None:
        pending.result()
    return wall[2:]


def trace(be, overlap: bool, start: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        steps(be, overlap, 12, start)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    ev = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")), key=lambda e: e["ts"])
    starts = [i for i, e in enumerate(ev) if e["cat"] == "kernel" and "embedding" in e["name"]]
    per_step = []
    for a, b in zip(starts[2:], starts[3:]):  # step a: from its embedding to the next step's
        span = ev[a:b]
        kern = sum(e["dur"] for e in span if e["cat"] == "kernel")
        copies = [e for e in span if e["cat"] == "gpu_memcpy"]
        last_kernel_end = max(e["ts"] + e["dur"] for e in span if e["cat"] == "kernel")
        per_step.append({"step_us": ev[b]["ts"] - ev[a]["ts"], "kernels_us": kern,
                         "gap_after_sampler_us": ev[b]["ts"] - last_kernel_end,
                         "copies_us": sum(e["dur"] for e in copies), "copies": len(copies)})
    return {k: float(np.median([s[k] for s in per_step])) for k in per_step[0]}


def main(args: list[str]) -> None:
    cfg = qwen05_config()
    be = CudaBackend(cfg, "fp16", 512, PROMPT + 256)
    be.load_weights(random_torch_weights(cfg, 0))
    rng = np.random.default_rng(0)
    be.prefill_batch(list(range(B)), [rng.integers(0, cfg.vocab_size, PROMPT).tolist() for _ in range(B)],
                     device=True)
    steps(be, False, 4, PROMPT)  # graphs captured
    pos = PROMPT + 4
    for rnd in range(2):  # the bench's own loop (prompts of 128, 255 steps), each mode in turn
        for overlap in (False, True):
            ms = 1e3 * np.asarray(_generate(be, B, PROMPT, 256, 0, overlap=overlap)["steps_s"][1:])
            print(f"bench loop {'overlapped' if overlap else 'plain':10s} median {np.median(ms):.4f} ms, p10 "
                  f"{np.percentile(ms, 10):.4f}, p90 {np.percentile(ms, 90):.4f}; steps 1-4, 100-103, 250-253: "
                  + " ".join(f"{x:.3f}" for x in np.r_[ms[:4], ms[100:104], ms[-4:]]), flush=True)
    be.reset()
    be.prefill_batch(list(range(B)), [rng.integers(0, cfg.vocab_size, PROMPT).tolist() for _ in range(B)],
                     device=True)
    pos = PROMPT
    for rnd in range(2):
        for overlap in (False, True):
            wall = steps(be, overlap, STEPS, pos)
            pos += STEPS
            tl = trace(be, overlap, pos)
            pos += 12
            print(f"round {rnd} {'overlapped' if overlap else 'plain':10s} {' '.join(args):10s} wall median "
                  f"{1e3 * np.median(wall):.4f} ms (p10 {1e3 * np.percentile(wall, 10):.4f}); GPU a step: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in tl.items()), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
