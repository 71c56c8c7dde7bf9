"""What the per-sync telemetry costs at the study's size: the trainer's side (the masters
rounded, the shares counted, their checksums) and the engine's (its buffers' checksums), on
Qwen2.5-0.5B shapes, after an in-place sync; and that the two sides agree (parity 1)."""

from __future__ import annotations

import time

import numpy as np


def bench_telemetry(backend, weights_torch: dict, dtype: str, repeats: int = 5) -> dict:
    import torch

    from ratchet.rl.telemetry import SyncTelemetry, parity

    class Masters:  # the Policy surface SyncTelemetry reads
        def export_weights(self):
            return weights_torch

    backend.update_weights(weights_torch)
    telemetry = SyncTelemetry(Masters(), dtype)
    trainer_s, engine_s, ok = [], [], []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        shares, expected = telemetry.measure(Masters())
        torch.cuda.synchronize()
        trainer_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        held = backend.weight_checksums()
        engine_s.append(time.perf_counter() - t)
        ok.append(parity(expected, held)[0])
    return {"params": sum(int(w.numel()) for w in weights_torch.values()),
            "trainer_s_median": float(np.median(trainer_s[1:])), "engine_s_median": float(np.median(engine_s[1:])),
            "parity": min(ok), "masters_off_grid_share": shares["sync/masters_off_grid_share"]}
