"""Engine <- trainer weights: a copy, because both hold the same layout; the engine rounds
the fp32 masters into its own buffers. Colocated: `sync_weights`; split: a broadcast of one
flat buffer (`WeightSender` -> `WeightReceiver`), over NCCL between two GPUs, else gloo."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from ratchet.model.flat_weights import FlatWeights, has_no_gaps
from ratchet.model.layout import expected_shapes, num_parameters


def engine_weights(policy) -> dict[str, np.ndarray]:
    """The fp32 masters under the engine names, as NumPy views of the live parameters."""
    return {name: w.detach().cpu().numpy() for name, w in policy.export_weights().items()}


def gpu_of(weights: Mapping[str, torch.Tensor]) -> torch.device | None:
    """The GPU that `weights` (FlatWeights, or a mapping of tensors) are on, else None."""
    first = weights.flat if isinstance(weights, FlatWeights) else next(iter(weights.values()))
    return first.device if first.is_cuda else None


def for_engine(engine, weights: Mapping[str, torch.Tensor]) -> Mapping:
    """`weights` as `engine.update_weights` takes them without a host copy: tensors on its
    GPU when it has one and they are on a GPU (FlatWeights stay one buffer), else NumPy arrays."""
    device = engine.weight_device
    if device != "cpu" and gpu_of(weights) is not None:
        if isinstance(weights, FlatWeights):
            return weights.on(device)
        return {k: v.to(device) for k, v in weights.items()}  # no copy when already there
    return {k: v.detach().cpu().numpy() for k, v in weights.items()}


def masters(policy) -> Mapping[str, torch.Tensor]:
    """The policy's fp32 masters for a sync: its one flat buffer where it has one (CUDA),
    else `export_weights`' mapping."""
    flat = policy.flat_weights() if hasattr(policy, "flat_weights") else None
    return flat if flat is not None else policy.export_weights()


def device_masters(policy) -> tuple[Mapping[str, torch.Tensor], int] | None:
    """(`masters`, their GPU's index) where they are on a GPU, else None: what a CUDA engine
    made on that GPU can start on, rounding them as `sync_weights` does."""
    weights = masters(policy)
    gpu = gpu_of(weights)
    return (weights, gpu.index) if gpu is not None else None


def sync_weights(engine, policy) -> None:
    """The trainer's fp32 masters into the engine, rounded there to its dtype."""
    engine.update_weights(for_engine(engine, masters(policy)))


def flatten(weights: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The weights as one new flat fp32 tensor [P], in the given (layout's) order: a copy, so
    the next optimiser step may change the masters while it travels. FlatWeights without gaps
    are that layout already: one copy of their buffer."""
    if isinstance(weights, FlatWeights) and has_no_gaps(weights.cfg):
        return weights.flat.detach().float().clone()
    return torch.cat([w.float().reshape(-1) for w in weights.values()])


def unflatten(flat: torch.Tensor, model_cfg) -> Mapping[str, torch.Tensor]:
    """`flatten`'s inverse by the layout: views of `flat` under the engine names (FlatWeights
    where the layout has no gaps, so a CUDA engine takes it in one launch)."""
    if has_no_gaps(model_cfg):
        return FlatWeights(model_cfg, flat)
    out, offset = {}, 0
    for name, shape in expected_shapes(model_cfg).items():
        size = int(np.prod(shape))
        out[name] = flat[offset:offset + size].view(shape)
        offset += size
    return out


class WeightSender:
    """Trainer side of the split broadcast: the masters as one flat fp32 buffer to every other
    rank. Under gloo the buffer is pinned host memory, reused: one device-to-host copy per
    sync. `send(async_op=True)` returns the work handle; wait on it before the next send
    (the buffer is rewritten), while the optimiser may already run the next step."""

    def __init__(self, policy, group=None):
        self.policy, self.group = policy, group
        self.nccl = torch.distributed.get_backend(group) == "nccl"
        self.staging = None

    def send(self, src: int = 0, async_op: bool = False, weights: dict | None = None):
        """Send `weights` (default: the policy's masters, in the layout's order)."""
        weights = masters(self.policy) if weights is None else weights
        flat = flatten(weights)  # [P] fp32
        if self.nccl and not flat.is_cuda:
            flat = flat.cuda()
        elif not self.nccl and flat.is_cuda:
            if self.staging is None:
                self.staging = torch.empty(flat.numel(), dtype=torch.float32, pin_memory=True)
            self.staging.copy_(flat)
            flat = self.staging
        self.sending = flat  # alive until the next send, which waits on this one first
        return torch.distributed.broadcast(flat, src=src, group=self.group, async_op=async_op)


class WeightReceiver:
    """Engine side: one flat fp32 buffer, received into and split by the layout. A CUDA
    engine takes it on the GPU (NCCL receives there; gloo receives into pinned host memory,
    then one host-to-device copy) and rounds it into its buffers in one launch."""

    def __init__(self, model_cfg, device: str = "cpu", group=None):
        self.model_cfg, self.group = model_cfg, group
        n, on_gpu = num_parameters(model_cfg), torch.device(device).type == "cuda"
        nccl = torch.distributed.is_initialized() and torch.distributed.get_backend(group) == "nccl"
        self.wire = torch.empty(n, dtype=torch.float32, device=device if nccl else "cpu",
                                pin_memory=on_gpu and not nccl)
        self.flat = torch.empty(n, dtype=torch.float32, device=device) if on_gpu and not nccl else self.wire

    def receive(self, src: int = 0) -> dict[str, torch.Tensor]:
        torch.distributed.broadcast(self.wire, src=src, group=self.group)
        if self.flat is not self.wire:
            self.flat.copy_(self.wire)  # from pinned memory: synchronous, done on return
        return unflatten(self.flat, self.model_cfg)

    def receive_into(self, engine, src: int = 0) -> None:
        engine.update_weights(for_engine(engine, self.receive(src)))
