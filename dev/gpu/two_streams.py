"""Is the decode step at B = 64 latency-bound enough that two halves on two streams beat it?
One backend decoding 64 rows (overlapped as the engine runs it) against two backends of 32
rows each on their own streams, each step of both launched before either is read; random
Qwen2.5-0.5B weights, the bench's workload. Prints median ms a step of 64 rows both ways.

    python -m dev.gpu.two_streams [--batch 64] [--steps 200] [--shape qwen2.5-0.5b]
"""

from __future__ import annotations

import argparse
import json
import time

import cupy as cp
import numpy as np

from ratchet.bench.workload import SHAPES, random_torch_weights
from ratchet.engine.factory import make_backend
from ratchet.engine.sampling import SamplingBatch


def run(backends, rows: int, prompt_len: int, steps: int, seed: int = 0) -> float:
    """Median wall ms a step (every backend's rows) over overlapped steps 2..steps."""
    cfg = backends[0].cfg
    rng = np.random.default_rng(seed)
    slots = list(range(rows))

    def batch(i: int) -> SamplingBatch:
        return SamplingBatch([seed] * rows, slots, [i] * rows, [1.0] * rows, [False] * rows)

    tokens = []
    for be in backends:
        be.reset()
        first = be.prefill_batch(slots, [rng.integers(0, cfg.vocab_size, prompt_len).tolist() for _ in slots],
                                 device=True)
        tokens.append(be.sample(first, batch(0))[0])
    cp.cuda.runtime.deviceSynchronize()
    pending = [be.decode_sample_async(slots, t, [prompt_len] * rows, batch(1)) for be, t in zip(backends, tokens)]
    feed, times = list(range(rows)), []
    t0 = time.perf_counter()
    for step in range(2, steps + 1):
        nxt = [be.decode_sample_async(slots, t, [prompt_len + step - 1] * rows, batch(step), feed=feed)
               for be, t in zip(backends, tokens)] if step < steps else None
        for p in pending:
            p.result()
        now = time.perf_counter()
        times.append(now - t0)
        t0, pending = now, nxt
    return 1e3 * float(np.median(times[2:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="qwen2.5-0.5b")
    args = ap.parse_args()
    cfg = SHAPES[args.shape]()
    weights = random_torch_weights(cfg, 0)
    max_seq = args.prompt_len + args.steps + 8
    one = make_backend("cuda", cfg, "fp16", args.batch, max_seq)
    one.load_weights(weights)
    halves = [make_backend("cuda", cfg, "fp16", args.batch // 2, max_seq) for _ in range(2)]
    for be in halves:
        be.load_weights(weights)
    out = {"shape": args.shape, "batch": args.batch}
    for name, backends, rows in (("one stream", [one], args.batch), ("two streams", halves, args.batch // 2),
                                 ("one stream again", [one], args.batch),
                                 ("half alone", halves[:1], args.batch // 2)):
        out[f"{name} ms a step"] = run(backends, rows, args.prompt_len, args.steps)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
