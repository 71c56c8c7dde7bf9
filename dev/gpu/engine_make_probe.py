"""What an ablation pays to make a measuring engine again, at Qwen2.5-Coder-1.5B's shapes with
random weights: ablate_decompose drops its idle engines through the gradient passes and the GRPO
steps (idle_engines.py) and its lap "idle engines released and made again" read 29.1 s on an H100
(forty-fourth session). Per round, synchronised: the memory handed back (gpu_memory.
return_gpu_memory), a 64-row fp16 CUDA engine of 1,024 positions made from the rounded host
weights (as Setup.engine made it before the forty-seventh session), and its first sync from the
masters; then one made on the masters themselves, rounded on the GPU (Setup.engine's `masters`).
    python3 dev/gpu/engine_make_probe.py [--rounds 3] [--invariant]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from ratchet.bench.workload import coder15_config, random_torch_weights
from ratchet.engines import make_engine
from ratchet.gpu_memory import return_gpu_memory
from ratchet.model.dtypes import round_to
from ratchet.model.io import EngineModel
from ratchet.rl.sync import device_masters, sync_weights
from ratchet.trainer.policy import Policy


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, round(time.perf_counter() - t0, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--invariant", action="store_true", help="batch-invariant engines (the exact fix's)")
    args = ap.parse_args()
    cfg = coder15_config()
    host = {k: v.cpu().numpy() for k, v in random_torch_weights(cfg).items()}
    rounded, round_s = timed(lambda: {k: round_to(v, "fp16") for k, v in host.items()})
    policy = Policy.from_weights(cfg, host, device="cuda")
    print(json.dumps({"rounded_on_host_s": round_s}), flush=True)
    for i in range(args.rounds):
        _, free_s = timed(return_gpu_memory)
        engine, make_s = timed(lambda: make_engine(EngineModel(cfg, rounded, "fp16"), backend="cuda",
                                                   max_batch_size=64, max_seq_len=1024,
                                                   batch_invariant=args.invariant))
        _, sync_s = timed(lambda: sync_weights(engine, policy))
        synced = engine.weight_checksums()
        del engine
        return_gpu_memory()
        on_gpu, device = device_masters(policy)
        engine, masters_s = timed(lambda: make_engine(EngineModel(cfg, on_gpu, "fp16"), backend="cuda",
                                                      max_batch_size=64, max_seq_len=1024,
                                                      batch_invariant=args.invariant, device=device))
        same = engine.weight_checksums() == synced
        print(json.dumps({"round": i, "invariant": args.invariant, "return_gpu_memory_s": free_s,
                          "make_s": make_s, "first_sync_s": sync_s, "made_on_masters_s": masters_s,
                          "same_bits": same}), flush=True)
        del engine


if __name__ == "__main__":
    main()
