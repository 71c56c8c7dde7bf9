"""What the per-sync telemetry costs at the study's size: the trainer's side (the masters
rounded, the shares counted, their checksums) and the engine's (its buffers' checksums), after
an in-place sync, by the one-kernel path (ratchet/engine/cuda/telemetry.py) and by torch's, in
one call; that both give the same counts and checksums, and that the two sides agree (parity)."""

from __future__ import annotations

import time

import numpy as np


def bench_telemetry(backend, weights_torch: dict, dtype: str, repeats: int = 5) -> dict:
    import cupy as cp
    import torch

    from ratchet.model.checksum import block_checksums
    from ratchet.rl.telemetry import SyncTelemetry, parity

    class Masters:  # the Policy surface SyncTelemetry reads
        def export_weights(self):
            return weights_torch

    def nudge():  # an update between syncs, as AdamW's: some rounded values change
        with torch.no_grad():
            for w in weights_torch.values():
                w.mul_(1 + 1e-3)

    backend.update_weights(weights_torch)
    out = {"params": sum(int(w.numel()) for w in weights_torch.values())}
    paths = {"torch": SyncTelemetry(Masters(), dtype, fused=False), "fused": SyncTelemetry(Masters(), dtype, fused=True)}
    seconds, same = {p: [] for p in paths}, []
    for _ in range(repeats + 1):
        nudge()  # both paths measure the same masters, after the same update
        got = {}
        for path, telemetry in paths.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            got[path] = telemetry.measure(Masters())
            torch.cuda.synchronize()
            seconds[path].append(time.perf_counter() - t)
        (shares, expected), (torch_shares, torch_expected) = got["fused"], got["torch"]
        same.append(expected == torch_expected and all(
            shares[k] == torch_shares[k] for k in ("sync/visible_share", "sync/masters_off_grid_share")))
    out.update({f"trainer_s_median_{p}": float(np.median(v[1:])) for p, v in seconds.items()})
    out["same_counts_and_checksums"] = all(same)
    backend.update_weights(weights_torch)
    engine = {"fused": [], "cupy_reductions": []}
    for _ in range(repeats + 1):
        t = time.perf_counter()
        held = backend.weight_checksums()
        engine["fused"].append(time.perf_counter() - t)
        t = time.perf_counter()
        with backend.stream:
            sums = block_checksums([w.reshape(-1).view(cp.int16) for w in backend.weights.values()], cp)
        engine["cupy_reductions"].append(time.perf_counter() - t)
    out.update({f"engine_s_median_{k}": float(np.median(v[1:])) for k, v in engine.items()})
    out["engine_paths_equal"] = list(held.values()) == sums
    out["parity"] = parity(expected, held)[0]
    out["visible_share"], out["masters_off_grid_share"] = shares["sync/visible_share"], shares["sync/masters_off_grid_share"]
    return out
