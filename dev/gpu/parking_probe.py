"""How long AdamW's state takes to park on the host and come back, at Qwen2.5-Coder-1.5B's shapes
(1.78B fp32 masters, 14.2 GB of moments), parked by ratchet/trainer/parking.py: ablate_decompose's
lap "AdamW state parked on the host" read 22.2 s over its five measured updates on an H100
(forty-fourth session), ~4.4 s a round trip, where the bus moves 28 GB in about 1 s.
    python3 dev/gpu/parking_probe.py [--cycles 5] [--ratchet-allocator]
(--ratchet-allocator: torch's allocator as a ratchet GPU stage sets it, gpu_memory.ALLOC_DEFAULT,
unless PYTORCH_CUDA_ALLOC_CONF is set.)
One JSON line a round trip: the cycle, seconds out and back (synchronised), GB/s, and whether the
state came back equal bit for bit. (The record h100-parking-probe-session46 also holds a flat-buffer
variant, measured with this probe at a45a2b5 beside it and not kept.)
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from ratchet.bench.workload import coder15_config
from ratchet.model.layout import expected_shapes
from ratchet.trainer.parking import parked_state


def optimizer_of_shapes(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> torch.optim.AdamW:
    """An AdamW whose state is random moments of the masters' shapes, as after a first step."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    params = [torch.nn.Parameter(torch.empty(s, device="cuda")) for s in shapes.values()]
    opt = torch.optim.AdamW(params, lr=1e-6)
    for p in params:
        opt.state[p] = {"step": torch.tensor(1.0),
                        "exp_avg": torch.randn(p.shape, device="cuda", generator=gen) * 1e-3,
                        "exp_avg_sq": torch.rand(p.shape, device="cuda", generator=gen) * 1e-6}
    return opt


def cuda_state(opt) -> list[torch.Tensor]:
    """The optimiser state on the GPU, in its order: what parking moves."""
    return [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.is_cuda]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--ratchet-allocator", action="store_true")
    args = ap.parse_args()
    if args.ratchet_allocator:
        from ratchet.gpu_memory import ALLOC_ENV, allocator_defaults

        allocator_defaults()
        print(json.dumps({ALLOC_ENV: os.environ[ALLOC_ENV]}), flush=True)
    opt = optimizer_of_shapes(expected_shapes(coder15_config()))
    before = [v.clone() for v in cuda_state(opt)]
    nbytes = sum(t.numel() * t.element_size() for t in before)
    for cycle in range(args.cycles):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with parked_state(opt) as moved:
            torch.cuda.synchronize()
            t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        after = cuda_state(opt)
        equal = len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
        print(json.dumps({"cycle": cycle, "tensors": moved, "gb": round(nbytes / 1e9, 2),
                          "out_s": round(t1 - t0, 3), "back_s": round(t2 - t1, 3),
                          "out_gb_s": round(nbytes / 1e9 / (t1 - t0), 1),
                          "back_gb_s": round(nbytes / 1e9 / (t2 - t1), 1), "equal": equal}), flush=True)


if __name__ == "__main__":
    main()
