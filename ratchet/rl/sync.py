"""Engine <- trainer weights: a copy, because both hold the same layout.

Colocated: `sync_weights(engine, policy)` hands the trainer's fp32 masters to
`Engine.update_weights`, which rounds them into its own buffers in place (fp16/bf16
round-to-nearest-even, as `.to(dtype)` does): GPU tensors straight to a CUDA engine, NumPy
views (no copy) to the NumPy engine. Split: the trainer broadcasts the masters as one
flat fp32 buffer through torch.distributed (gloo on CPU, NCCL on GPU), the engine process
receives into a buffer it allocated once and does the same update.
"""

from __future__ import annotations

import numpy as np
import torch

from ratchet.model.layout import expected_shapes


def engine_weights(policy) -> dict[str, np.ndarray]:
    """The fp32 masters under the engine names, as NumPy views of the live parameters."""
    return {name: w.detach().cpu().numpy() for name, w in policy.export_weights().items()}


def sync_weights(engine, policy) -> None:
    """A CUDA engine takes the trainer's GPU tensors as they are (rounded into its buffers in
    one launch through DLPack, no host copy); otherwise the masters go as NumPy views."""
    weights = policy.export_weights()
    on_gpu = next(iter(weights.values())).is_cuda
    if engine.backend_name == "cuda" and on_gpu:
        engine.update_weights(weights)
    else:
        engine.update_weights(engine_weights(policy))


def flat_size(model_cfg) -> int:
    return sum(int(np.prod(s)) for s in expected_shapes(model_cfg).values())


def broadcast_weights(policy, src: int = 0, group=None, async_op: bool = False):
    """Trainer side: send the masters to every other rank of `group`. With `async_op`,
    returns the work handle (wait on it before the next broadcast); the flat buffer is a
    copy, so the next optimiser step may run while it is in flight."""
    flat = torch.cat([w.reshape(-1) for w in policy.export_weights().values()])  # [P] fp32
    if torch.distributed.get_backend(group) != "nccl":
        flat = flat.cpu()
    return torch.distributed.broadcast(flat, src=src, group=group, async_op=async_op)


class WeightReceiver:
    """Engine side: one flat fp32 buffer, received into and split by the layout."""

    def __init__(self, model_cfg):
        self.shapes = expected_shapes(model_cfg)
        self.buffer = torch.empty(flat_size(model_cfg), dtype=torch.float32)

    def receive(self, src: int = 0, group=None) -> dict[str, np.ndarray]:
        torch.distributed.broadcast(self.buffer, src=src, group=group)
        flat = self.buffer.numpy()
        out, offset = {}, 0
        for name, shape in self.shapes.items():
            size = int(np.prod(shape))
            out[name] = flat[offset:offset + size].reshape(shape)
            offset += size
        return out

    def receive_into(self, engine, src: int = 0, group=None) -> None:
        engine.update_weights(self.receive(src, group))
