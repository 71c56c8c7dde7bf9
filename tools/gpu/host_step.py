"""Where the wall time of a B = 64 decode step goes beyond the graph: `decode_sample` as the
engine calls it (Python lists in), the graph replay alone (launch + synchronize), and the
host's share (checks, staging, parameter packing) without a launch. Qwen2.5-0.5B shapes,
random weights, contexts 148 to ~550.

    PYTHONPATH=. python3 tools/gpu/host_step.py
"""

from __future__ import annotations

import time

import cupy as cp
import numpy as np

from ratchet.engine.cuda import sampler as gpu_sampler
from ratchet.engine.cuda.backend import PARAMS, CudaBackend
from ratchet.engine.cuda.bench import qwen05_config, random_torch_weights
from ratchet.engine.sampler import sampling_rows

B = 64


def per_call_us(fn, n: int = 200) -> float:
    cp.cuda.runtime.deviceSynchronize()
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    cp.cuda.runtime.deviceSynchronize()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    cfg = qwen05_config()
    be = CudaBackend(cfg, "fp16", B, 1024)
    be.load_weights(random_torch_weights(cfg, 0))
    slots = list(range(B))
    be.prefill_batch(slots, [[1] * 128] * B, device=True)
    seeds, ones, falses = [0] * B, [1.0] * B, [False] * B
    toks = [int(t) for t in np.arange(B) * 7]
    pos = {"p": 128}

    def decode_sample(i):
        be.decode_sample(slots, toks, [pos["p"]] * B, seeds, slots, [i] * B, ones, falses)
        pos["p"] += 1

    for i in range(20):
        decode_sample(i)
    graph = be._graph(B, True, 0)

    def host_only(i):  # what decode_sample does on the host, without the launch
        s, t, p = be._check_decode(slots, toks, [pos["p"] - 1] * B)
        temps, greedy = sampling_rows(ones, falses, B, "decode_sample")
        b, host, k = be._stage_decode(s, t, p)
        gpu_sampler.pack_params(seeds, slots, [i] * B, temps, greedy, out=host[PARAMS:PARAMS + 5, :B])
        out = be.host_out_np[k]
        return out[0, :B].astype(np.int64), out[1, :B].view(np.float32).copy()

    def replay(i):
        graph.launch(be.stream)
        be.stream.synchronize()

    parts = {k: [] for k in ("host before", "upload + launch calls", "wait (synchronize)", "host after",
                             "GPU: upload..download (events)")}

    def timed_step(i):  # decode_sample's own steps, with clocks between them
        t0 = time.perf_counter()
        s, t, p = be._check_decode(slots, toks, [pos["p"]] * B)
        temps, greedy = sampling_rows(ones, falses, B, "decode_sample")
        b, host, k = be._stage_decode(s, t, p)
        gpu_sampler.pack_params(seeds, slots, [i] * B, temps, greedy, out=host[PARAMS:PARAMS + 5, :B])
        start, end = cp.cuda.Event(), cp.cuda.Event()
        t1 = time.perf_counter()
        start.record(be.stream)
        be._run_decode(b, True, k)
        end.record(be.stream)
        t2 = time.perf_counter()
        be.lengths[s] = p + 1
        be.stream.synchronize()
        t3 = time.perf_counter()
        out = be.host_out_np[k]
        out[0, :B].astype(np.int64), out[1, :B].view(np.float32).copy()
        t4 = time.perf_counter()
        pos["p"] += 1
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[k].append(1e6 * v)
        parts["GPU: upload..download (events)"].append(1e3 * cp.cuda.get_elapsed_time(start, end))

    print(f"decode_sample      {per_call_us(decode_sample, 400):8.1f} us  (wall, as the engine calls it)")
    print(f"graph replay+sync  {per_call_us(replay):8.1f} us")
    print(f"host work alone    {per_call_us(host_only, 2000):8.1f} us")
    per_call_us(timed_step, 200)
    for k, v in parts.items():
        print(f"  {k:32s} median {np.median(v):8.1f} us  p90 {np.percentile(v, 90):8.1f}")


if __name__ == "__main__":
    main()
