"""Host rounding of a model's weights to the engine dtypes, NumPy's casts against torch's (the
same bits: tests/test_dtypes.py), timed on this machine's CPU: what an ablation run pays each
time it builds an engine from the fp32 weights, and the CUDA engine's upload casts on the threads
it uses for them. python -m dev.round_bench [--params 630e6]"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", type=float, default=630e6, help="values rounded (0.5B's engine weights: 630M)")
    ap.add_argument("--tensor", type=float, default=4.4e6, help="values a tensor (0.5B's gate_up: 8.7M, o: 0.8M)")
    args = ap.parse_args()
    import torch

    from ratchet.model import dtypes

    rng = np.random.default_rng(0)
    n, size = int(args.params), int(args.tensor)
    weights = [rng.standard_normal(size, dtype=np.float32) * np.float32(0.02) for _ in range(max(1, n // size))]
    found = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "values": size * len(weights)}
    threads = min(8, os.cpu_count() or 1)  # as the CUDA engine's upload casts (backend._copy_mapping)
    torch_min = dtypes.TORCH_CAST_MIN
    for dtype in ("fp16", "bf16"):
        for way, limit in (("numpy", 1 << 62), ("torch", torch_min)):
            dtypes.TORCH_CAST_MIN = limit
            start = time.perf_counter()
            out = [dtypes.round_to(w, dtype) for w in weights]
            found[f"{dtype}_{way}_s"] = round(time.perf_counter() - start, 3)
            found[f"{dtype}_{way}_sum"] = float(sum(float(o.astype(np.float64).sum()) for o in out[:4]))
            cast = dtypes.fp16_values if dtype == "fp16" else dtypes.fp32_to_bf16_bits
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=threads) as pool:
                stored = list(pool.map(cast, weights))
            found[f"{dtype}_{way}_storage_{threads}_threads_s"] = round(time.perf_counter() - start, 3)
            del stored
    dtypes.TORCH_CAST_MIN = torch_min
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
