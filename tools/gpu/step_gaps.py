"""A/B of the B = 64 decode step with wo / w_down split along K (`split_products`) and as
cuBLAS's own products, one process, rounds interleaved (clocks and L2 state drift over a
run), the same step replayed (random prompts of 250-350 tokens, a random token a row). Two
regimes:
- from an idle GPU, as the bench and the engine run a step: events around upload, graph and
  download, each step waited for before the next;
- queued behind a 3 ms spin kernel, so that the step's submission is done before it starts:
  the GPU's time alone.
Then the per-kernel profile (CUPTI) of each.

    PYTHONPATH=. python3 tools/gpu/step_gaps.py [MAX_BATCH [VARIANT]]
    (MAX_BATCH: the backend's capacity, default 64; VARIANT: "split" or "cublas" alone in the
    process, or "cublas-first": both, cuBLAS's own captured first; default both, split first)
"""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np

from ratchet.engine.cuda.backend import CudaBackend
from ratchet.engine.cuda.bench import Events, profile_decode, qwen05_config, random_torch_weights

B = 64
SPIN = r"""extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}"""
VARIANTS = {"split wo, w_down": ("wo", "w_down"), "cuBLAS's own": ()}


def main(max_batch: int = B, only: str | None = None) -> None:
    if only == "cublas-first":
        variants = dict(reversed(list(VARIANTS.items())))
    else:
        variants = {k: v for k, v in VARIANTS.items() if only is None or (only == "split") == bool(v)}
    cfg = qwen05_config()
    be = CudaBackend(cfg, "fp16", max_batch, 384)
    print(f"backend capacity {max_batch} rows, B = {B}")
    be.load_weights(random_torch_weights(cfg, 0))
    rng = np.random.default_rng(0)
    lengths = rng.integers(250, 350, B)
    be.prefill_batch(list(range(B)), [rng.integers(0, cfg.vocab_size, n).tolist() for n in lengths], device=True)
    tokens = rng.integers(0, cfg.vocab_size, B).tolist()
    spin = cp.RawKernel(SPIN, "spin")
    graphs = {}
    for name, split in variants.items():
        be.split_products, be.graphs = split, {}
        be.lengths[:B] = lengths
        be.decode_sample(list(range(B)), tokens, lengths.tolist(), [0] * B, list(range(B)), [1] * B, [1.0] * B,
                         [False] * B)
        graphs[name] = be.graphs
    idle = {k: [] for k in variants}
    queued = {k: [] for k in variants}
    for _ in range(8):
        for name, split in variants.items():
            be.split_products, be.graphs = split, graphs[name]
            ev = Events()
            for _ in range(25):
                with ev.time(be.stream):
                    be._run_decode(B, True, 0)
            idle[name] += ev.ms
            graph = be.graphs[(B, True)]
            for _ in range(10):
                with be.stream:
                    spin((1,), (1,), (np.int64(6_000_000),))
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(be.stream)
                graph.launch(be.stream)
                end.record(be.stream)
                end.synchronize()
                queued[name].append(cp.cuda.get_elapsed_time(start, end))
    for name in variants:
        print(f"{name:18s} from idle {np.median(idle[name]):.4f} ms (p10 {np.percentile(idle[name], 10):.4f}), "
              f"queued {np.median(queued[name]):.4f} ms (p10 {np.percentile(queued[name], 10):.4f})")
    for name, split in variants.items():
        be.split_products, be.graphs = split, graphs[name]
        res = profile_decode(be, B, top=8)
        print(f"{name}: kernels {res['kernel_us_per_step_total']:.1f} us a step (CUPTI)")
        for kernel, us, n in res["kernels (name, us/step, launches/step)"]:
            print(f"   {us:8.2f} us  {n:5.1f}x  {kernel[:70]}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]), *sys.argv[2:3])
