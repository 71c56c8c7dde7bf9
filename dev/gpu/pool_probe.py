"""Where CuPy's pool grows as an ablation run starts, at Qwen2.5-Coder-1.5B's shapes with random
weights: the pool's total and in-use GiB, and torch's allocated, after each piece a fix run
builds (its engine, the trainer, the sync telemetry, a sync, rollouts, the eval's engine). The
thirty-fourth session's ablate_fix saw the pool at 18.8 GiB after "trainer and engines", where a
64-row engine is ~5.5 GB and the telemetry's words 3.6 (results/records/h100-1.5b-ablate-memory/).
    python3 dev/gpu/pool_probe.py [--invariant]   # --invariant: the exact fix's engine
    python3 dev/gpu/pool_probe.py --sequence [--release]   # ablate_fix's five runs' engines in turn
The sequence builds what each of ablate_fix's runs builds in CuPy's pool (none, fix, exact, tis, mis:
the exact fix on a batch-invariant engine with a fast one for its evals), drops it, and notes the
pool after each; --release hands the pool's cached blocks back after each run, as fix_runs does.
"""
from __future__ import annotations

import argparse
import json

import cupy as cp
import numpy as np
import torch

from ratchet.bench.workload import coder15_config, random_torch_weights
from ratchet.engine.request import Request
from ratchet.engines import make_engine
from ratchet.model.dtypes import round_to
from ratchet.model.io import EngineModel
from ratchet.rl.sync import sync_weights
from ratchet.rl.telemetry import SyncTelemetry
from ratchet.trainer.policy import Policy

rows: list[dict] = []


def note(what: str) -> None:
    torch.cuda.synchronize()
    pool = cp.get_default_memory_pool()
    rows.append({"after": what, "pool_total_gib": pool.total_bytes() / 2**30, "pool_used_gib": pool.used_bytes() / 2**30,
                 "torch_allocated_gib": torch.cuda.memory_allocated() / 2**30})
    print(json.dumps(rows[-1]), flush=True)


def new_engine(cfg, rounded: dict, invariant: bool = False):
    """A 64-row fp16 CUDA engine of 1,024 positions, as an ablation run makes it."""
    return make_engine(EngineModel(cfg, rounded, "fp16"), backend="cuda", max_batch_size=64, max_seq_len=1024,
                       batch_invariant=invariant)


def rollouts(engine, rng) -> None:
    """A step's 64 answers of up to 384 tokens to random 150-token prompts."""
    engine.generate([Request(i, rng.integers(0, 1000, 150).tolist(), max_new_tokens=384, temperature=1.0, seed=i)
                     for i in range(64)])


def sequence(cfg, host: dict, rounded: dict, release: bool) -> None:
    """ablate_fix's runs' CuPy allocations in turn, each dropped before the next."""
    from ratchet.gpu_memory import gpu_highs_gib, release_cupy_cache

    policy = Policy.from_weights(cfg, host, device="cuda")
    rng = np.random.default_rng(0)
    for name in ("none", "fix", "exact", "tis", "mis"):
        engine = new_engine(cfg, rounded, invariant=name == "exact")
        telemetry = SyncTelemetry(policy, "fp16")
        sync_weights(engine, policy)
        rollouts(engine, rng)
        evals = new_engine(cfg, rounded) if name == "exact" else None
        note(f"run {name}: its engines and telemetry")
        del engine, telemetry, evals
        if release:
            release_cupy_cache()
        note(f"run {name} dropped" + (" and the pool released" if release else ""))
    print(json.dumps({"pool_most_gib": gpu_highs_gib().get("cupy pool"), "release": release}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--invariant", action="store_true")
    ap.add_argument("--sequence", action="store_true")
    ap.add_argument("--release", action="store_true")
    args = ap.parse_args()
    cfg = coder15_config()
    host = {k: v.cpu().numpy() for k, v in random_torch_weights(cfg).items()}
    torch.cuda.empty_cache()
    note("random weights on the host")
    rounded = {k: round_to(v, "fp16") for k, v in host.items()}
    if args.sequence:
        return sequence(cfg, host, rounded, args.release)
    engine = new_engine(cfg, rounded, invariant=args.invariant)
    note("the run's engine (64 rows)")
    policy = Policy.from_weights(cfg, host, device="cuda")
    note("the trainer's masters")
    telemetry = SyncTelemetry(policy, "fp16")
    note("the sync telemetry")
    sync_weights(engine, policy)
    note("a sync")
    rollouts(engine, np.random.default_rng(0))
    note("64 rollouts of up to 384 tokens")
    evals = new_engine(cfg, rounded)
    note("the eval's engine")
    del evals, engine, telemetry
    note("both engines and the telemetry dropped")


if __name__ == "__main__":
    main()
