"""How long AdamW's state takes to park on the host and come back, at Qwen2.5-Coder-1.5B's shapes
(1.78B fp32 masters, 14.2 GB of moments), for each way of parking: ablate_decompose's lap "AdamW
state parked on the host" read 22.2 s over its five measured updates on an H100 (forty-fourth
session), ~4.4 s a round trip, where the bus moves 28 GB in about 1 s.
    python3 dev/gpu/parking_probe.py [--cycles 5] [--ways per_tensor,ratchet] [--ratchet-allocator]
(--ratchet-allocator: torch's allocator as a ratchet GPU stage sets it, gpu_memory.ALLOC_DEFAULT,
unless PYTORCH_CUDA_ALLOC_CONF is set.)
One JSON line a round trip: the way, the cycle, seconds out and back (synchronised), GB/s, and
whether the state came back equal bit for bit.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch

from ratchet.bench.workload import coder15_config
from ratchet.model.layout import expected_shapes
from ratchet.trainer import parking


@contextlib.contextmanager
def parked_per_tensor(optimizer):
    """The way parking.py parked up to a45a2b5: a pinned tensor a state entry, blocking copies,
    torch's caching host allocator keeping the pages between parkings."""
    moved = []
    for state in optimizer.state.values():
        for key in list(state):
            value = state[key]
            if isinstance(value, torch.Tensor) and value.is_cuda:
                state[key] = torch.empty(value.shape, dtype=value.dtype, pin_memory=True).copy_(value)
                moved.append((state, key, value.device))
            del value
    try:
        yield len(moved)
    finally:
        for state, key, device in moved:
            state[key] = state[key].to(device)


WAYS = {"per_tensor": parked_per_tensor, "ratchet": parking.parked_state}  # ratchet: the product's, as checked out


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


def snapshot(opt) -> list[torch.Tensor]:
    return [v.clone() for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.is_cuda]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--ways", default="per_tensor,ratchet")
    ap.add_argument("--ratchet-allocator", action="store_true")
    args = ap.parse_args()
    if args.ratchet_allocator:
        from ratchet.gpu_memory import ALLOC_ENV, allocator_defaults

        allocator_defaults()
        print(json.dumps({ALLOC_ENV: os.environ[ALLOC_ENV]}), flush=True)
    shapes = expected_shapes(coder15_config())
    for way in args.ways.split(","):
        opt = optimizer_of_shapes(shapes)
        before = snapshot(opt)
        nbytes = sum(t.numel() * t.element_size() for t in before)
        for cycle in range(args.cycles):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with WAYS[way](opt) as moved:
                torch.cuda.synchronize()
                t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            after = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.is_cuda]
            equal = len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
            print(json.dumps({"way": way, "cycle": cycle, "tensors": moved, "gb": round(nbytes / 1e9, 2),
                              "out_s": round(t1 - t0, 3), "back_s": round(t2 - t1, 3),
                              "out_gb_s": round(nbytes / 1e9 / (t1 - t0), 1),
                              "back_gb_s": round(nbytes / 1e9 / (t2 - t1), 1), "equal": equal}), flush=True)
        del opt, before, after
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
