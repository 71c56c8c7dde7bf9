"""What each weight sync carried to the engine: the share of weights whose engine-dtype value
it changed (the rest of the update rounded away), the masters off the engine dtype's grid,
and whether the engine now holds exactly the masters rounded (a stale or partial sync, as
TRL and NeMo users have hit, sets `sync/weights_parity` to 0 and names the first tensor)."""

from __future__ import annotations

import os
import time
from itertools import pairwise

import torch

from ratchet.model.checksum import BLOCK
from ratchet.trainer.precision import torch_dtype


def torch_checksums(tensors) -> list[tuple[int, int]]:
    """ratchet.model.checksum's checksum of each torch tensor holding stored values (fp16, bf16
    or fp32), computed on its device: tensors of one size reduced together, one read-back."""
    tensors = list(tensors)
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.numel(), []).append(i)
    tables, order = [], []
    for idx in groups.values():
        tables.append(_stacked_sums(_rows([_words(tensors[i]) for i in idx])))
        order += idx
    out: list = [None] * len(tensors)
    for i, (within, across) in zip(order, torch.cat(tables).tolist() if tables else []):
        out[i] = (int(within), int(across))
    return out


def torch_checksum(tensor) -> tuple[int, int]:
    return torch_checksums([tensor])[0]


def _words(tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.int16)


def _rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """[g, *shape]: tensors of one shape and dtype as one. Where they are views of one storage
    at one stride (a layer's tensor in the flat CUDA masters), a strided view of it, each
    row exactly one tensor's elements: no copy of the model on every sync (ratchet.model.
    checksum.rows_of is the same for the engine's arrays); otherwise a stacked copy."""
    first = tensors[0]
    storage = first.untyped_storage().data_ptr()
    if len(tensors) > 1 and all(t.is_contiguous() and t.dtype == first.dtype
                                and t.untyped_storage().data_ptr() == storage for t in tensors):
        size = first.element_size()
        starts = [t.data_ptr() for t in tensors]
        step = starts[1] - starts[0]
        if (step >= first.numel() * size and step % size == 0
                and all(b - a == step for a, b in pairwise(starts))):
            return first.as_strided((len(tensors), *first.shape), (step // size, *first.stride()))
    return torch.stack(tensors)


def _stacked_sums(stacked: torch.Tensor) -> torch.Tensor:
    """[g, n] int16 words -> [g, 2] int64, as ratchet.model.checksum.stacked_sums."""
    g, n = stacked.shape
    dev = stacked.device
    blocks, full = n // BLOCK, n // BLOCK * BLOCK
    grid = stacked[:, :full].reshape(g, blocks, BLOCK)
    tail = stacked[:, full:].to(torch.int64)
    position = torch.arange(1, BLOCK + 1, dtype=torch.int64, device=dev)
    within = (grid.sum(1, dtype=torch.int64) * position).sum(1) + (tail * position[:n - full]).sum(1)
    across = ((grid.sum(2, dtype=torch.int64) * torch.arange(1, blocks + 1, dtype=torch.int64, device=dev)).sum(1)
              + tail.sum(1) * (blocks + 1))
    return torch.stack([within, across], dim=1)


class SyncTelemetry:
    """Keeps the last synced weights, rounded, to compare the next sync with. With the masters
    on a GPU and CuPy there, one kernel a sync (ratchet/engine/cuda/telemetry.py: the rounding,
    both counts and the checksums in one pass, the last values in a buffer of its own);
    otherwise torch on the trainer's device, tensors of one shape stacked, a few launches for
    the whole model. Both give the same counts and checksums (a NaN master aside: the kernel
    rounds it to the NaN the sync writes, torch to its own). `measure` is apart from the parity
    check so the split mode can measure at send time and check when the engine reports back."""

    def __init__(self, policy, engine_dtype: str, held: dict[str, torch.Tensor] | None = None,
                 fused: bool | None = None):
        """`held`: what the engine holds now, when it is not the masters rounded (a resumed split
        engine, its dtype's values). `fused`: the one-kernel path (None: wherever it runs)."""
        self.dtype = torch_dtype(engine_dtype)
        weights = policy.export_weights()
        self.names = list(weights)
        self.fused = _fused_telemetry(weights, engine_dtype, held) if fused in (None, True) else None
        if fused and self.fused is None:
            raise ValueError("sync telemetry: the one-kernel path needs fp32 masters on a GPU and CuPy")
        if self.fused is not None:
            return
        self.groups: dict[tuple, list[str]] = {}
        for name, w in weights.items():
            self.groups.setdefault(tuple(w.shape), []).append(name)
        start = weights if held is None else held
        device = next(iter(weights.values())).device
        self.last = {shape: torch.stack([start[n].detach().to(device) for n in names]).to(self.dtype)
                     for shape, names in self.groups.items()}

    def measure(self, policy) -> tuple[dict[str, float], dict[str, tuple[int, int]]]:
        """(the shares of this sync, the checksums of what the engine should now hold)."""
        start = time.perf_counter()
        weights = policy.export_weights()
        if self.fused is not None:
            changed, off, found = self.fused.measure(weights)
            total = sum(self.fused.sizes)
        else:
            changed, off, found, total = self._measure_torch(weights)
        return ({"sync/visible_share": changed / total, "sync/masters_off_grid_share": off / total,
                 "time/telemetry_s": time.perf_counter() - start},
                {n: (int(found[n][0]), int(found[n][1])) for n in self.names})  # layout order

    def _measure_torch(self, weights) -> tuple[int, int, dict, int]:
        counts, tables, rounded, total = [], [], {}, 0
        for shape, names in self.groups.items():
            masters = _rows([weights[n].detach() for n in names])  # [g, *shape]
            r = rounded[shape] = masters.to(self.dtype)
            counts.append(torch.stack([torch.count_nonzero(r != self.last[shape]),
                                       torch.count_nonzero(r.float() != masters)]))
            tables.append(_stacked_sums(r.reshape(len(names), -1).view(torch.int16)))
            total += masters.numel()
        changed, off = torch.stack(counts).sum(0).tolist()
        by_group = iter(torch.cat(tables).tolist())
        found = {n: tuple(next(by_group)) for names in self.groups.values() for n in names}
        self.last = rounded
        return changed, off, found, total


def _fused_telemetry(weights: dict[str, torch.Tensor], engine_dtype: str, held):
    """The one-kernel telemetry for these masters, or None where it cannot run (masters on the
    host or not contiguous fp32, an fp32 engine, no CuPy) or where RATCHET_FUSED_TELEMETRY=0
    asks for torch's path (to compare the two, or to step around a kernel on a new GPU)."""
    if engine_dtype not in ("fp16", "bf16") or os.environ.get("RATCHET_FUSED_TELEMETRY", "1") == "0":
        return None
    if not all(w.is_cuda and w.dtype == torch.float32 and w.is_contiguous() for w in weights.values()):
        return None
    try:
        from ratchet.engine.cuda.telemetry import MasterTelemetry
    except ImportError:  # no CuPy: torch's path
        return None
    words = None if held is None else {n: held[n].detach().contiguous().view(torch.int16) for n in weights}
    return MasterTelemetry(weights, engine_dtype, words)


def parity(expected: dict[str, tuple[int, int]], held: dict[str, tuple[int, int]]) -> tuple[float, str | None]:
    """(1.0 when every tensor's checksum matches, else 0.0; the first tensor that differs)."""
    first = next((name for name in expected if tuple(held.get(name, ())) != tuple(expected[name])), None)
    return (1.0 if first is None else 0.0), first


def after_sync(telemetry: SyncTelemetry, policy, engine, log_prefix: str) -> dict[str, float]:
    """The colocated loop's and the ablations' telemetry of a sync that just happened."""
    shares, expected = telemetry.measure(policy)
    start = time.perf_counter()
    try:
        held = engine.weight_checksums()
    except NotImplementedError as e:  # an engine that cannot read its own weights (vLLM may not)
        print(f"{log_prefix} sync/weights_parity nan: {e}", flush=True)
        return {**shares, "sync/weights_parity": float("nan"),
                "time/telemetry_s": shares["time/telemetry_s"] + time.perf_counter() - start}
    ok, first = parity(expected, held)
    if first is not None:
        print(f"{log_prefix} sync/weights_parity 0: the engine's {first} is not the trainer's "
              "masters rounded (a stale or partial weight sync)", flush=True)
    return {**shares, "sync/weights_parity": ok,
            "time/telemetry_s": shares["time/telemetry_s"] + time.perf_counter() - start}
