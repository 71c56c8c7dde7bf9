"""The optimiser's state parked in host memory while a measurement holds the GPU. AdamW's two
moments are twice the fp32 masters (14 GB at 1.5B) and nothing reads them between updates,
while the decomposition's measurements hold up to four gradients of the masters' size. They
are copied out and back exactly, so the next update takes the same bits."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def parked_state(optimizer: torch.optim.Optimizer):
    """Inside: every CUDA tensor of `optimizer.state` in pinned host memory, its GPU memory
    free; after: copied back to the device it came from. Host state stays where it is."""
    moved = []
    for state in optimizer.state.values():
        for key in list(state):
            value = state[key]
            if isinstance(value, torch.Tensor) and value.is_cuda:
                # pinned: a copy at the bus's rate, and torch's host allocator keeps the pages
                # for the next parking
                state[key] = torch.empty(value.shape, dtype=value.dtype, pin_memory=True).copy_(value)
                moved.append((state, key, value.device))
            del value
    try:
        yield len(moved)
    finally:
        for state, key, device in moved:
            state[key] = state[key].to(device)
