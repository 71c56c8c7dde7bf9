"""What each weight sync carried to the engine: the share of weights whose engine-dtype value
it changed (the rest of the update rounded away), the masters off the engine dtype's grid,
and whether the engine now holds exactly the masters rounded (a stale or partial sync, as
TRL and NeMo users have hit, sets `sync/weights_parity` to 0 and names the first tensor)."""

from __future__ import annotations

import time

import torch

from ratchet.model.checksum import BLOCK
from ratchet.trainer.precision import torch_dtype


def torch_checksums(tensors) -> list[tuple[int, int]]:
    """ratchet.model.checksum's checksum of each torch tensor holding stored values (fp16, bf16
    or fp32), computed on its device and read back in one transfer."""
    sums = [torch.stack(_torch_sums(t)) for t in tensors]
    return [(int(a), int(b)) for a, b in torch.stack(sums).tolist()] if sums else []


def torch_checksum(tensor) -> tuple[int, int]:
    return torch_checksums([tensor])[0]


def _torch_sums(tensor):
    words = tensor.detach().contiguous().reshape(-1).view(torch.int16)
    n, dev = words.numel(), words.device
    blocks, full = n // BLOCK, n // BLOCK * BLOCK
    grid = words[:full].view(blocks, BLOCK)
    tail = words[full:].to(torch.int64)
    position = torch.arange(1, BLOCK + 1, dtype=torch.int64, device=dev)
    within = (grid.sum(0, dtype=torch.int64) * position).sum() + (tail * position[:n - full]).sum()
    across = ((grid.sum(1, dtype=torch.int64) * torch.arange(1, blocks + 1, dtype=torch.int64, device=dev)).sum()
              + tail.sum() * (blocks + 1))
    return within, across


class SyncTelemetry:
    """Keeps the last synced weights, rounded (on the trainer's device), to compare the next
    sync with; `rounded(policy)` and `measure(...)` are split so the split mode can measure
    at send time and check parity when the engine reports back."""

    def __init__(self, policy, engine_dtype: str):
        self.dtype = torch_dtype(engine_dtype)
        self.last = self.rounded(policy)

    def rounded(self, policy) -> dict[str, torch.Tensor]:
        return {k: w.detach().to(self.dtype, copy=True) for k, w in policy.export_weights().items()}

    def measure(self, policy) -> tuple[dict[str, float], dict[str, tuple[int, int]]]:
        """(the shares of this sync, the checksums of what the engine should now hold)."""
        start = time.perf_counter()
        rounded, counts, total = self.rounded(policy), [], 0
        for name, w in policy.export_weights().items():  # counted on the device, read back once
            counts.append(torch.stack([torch.count_nonzero(rounded[name] != self.last[name]),
                                       torch.count_nonzero(rounded[name].float() != w)]))
            total += w.numel()
        changed, off = torch.stack(counts).sum(0).tolist()
        checksums = dict(zip(rounded, torch_checksums(rounded.values())))
        self.last = rounded
        return {"sync/visible_share": changed / total, "sync/masters_off_grid_share": off / total,
                "time/telemetry_s": time.perf_counter() - start}, checksums


def parity(expected: dict[str, tuple[int, int]], held: dict[str, tuple[int, int]]) -> tuple[float, str | None]:
    """(1.0 when every tensor's checksum matches, else 0.0; the first tensor that differs)."""
    first = next((name for name in expected if tuple(held.get(name, ())) != tuple(expected[name])), None)
    return (1.0 if first is None else 0.0), first


def after_sync(telemetry: SyncTelemetry, policy, engine, log_prefix: str) -> dict[str, float]:
    """The colocated loop's and the ablations' telemetry of a sync that just happened."""
    shares, expected = telemetry.measure(policy)
    start = time.perf_counter()
    ok, first = parity(expected, engine.weight_checksums())
    if first is not None:
        print(f"{log_prefix} sync/weights_parity 0: the engine's {first} is not the trainer's "
              "masters rounded (a stale or partial weight sync)", flush=True)
    return {**shares, "sync/weights_parity": ok,
            "time/telemetry_s": shares["time/telemetry_s"] + time.perf_counter() - start}
