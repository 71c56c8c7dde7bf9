"""AdamW's state parked on the host during the decomposition's measurements (ratchet.trainer.
parking): its GPU memory is free inside, and the next update after it is the bits of an
update that never parked."""

from __future__ import annotations

import pytest
import torch

from ratchet.trainer.parking import parked_state


def _twins(device: str):
    """Two identical models, each with a fused (GPU) or plain (CPU) AdamW one step in."""
    out = []
    for _ in range(2):
        torch.manual_seed(0)
        model = torch.nn.Linear(256, 512).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device == "cuda" or None, foreach=False)
        model(torch.randn(8, 256, device=device)).square().sum().backward()
        opt.step()
        out.append((model, opt))
    return out


def _step(model, opt, device: str) -> list[torch.Tensor]:
    torch.manual_seed(1)
    opt.zero_grad()
    model(torch.randn(8, 256, device=device)).square().sum().backward()
    opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_host_state_stays_where_it_is():
    (model, opt), _ = _twins("cpu")
    before = {id(v) for s in opt.state.values() for v in s.values()}
    with parked_state(opt) as moved:
        assert moved == 0
        assert {id(v) for s in opt.state.values() for v in s.values()} == before
    assert {id(v) for s in opt.state.values() for v in s.values()} == before


@pytest.mark.gpu
def test_parked_state_frees_its_gpu_memory_and_comes_back_to_the_same_bits():
    (model, opt), (twin, twin_opt) = _twins("cuda")
    state_bytes = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if v.is_cuda)
    assert state_bytes >= 2 * sum(p.numel() * 4 for p in model.parameters())  # the two moments at least
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    with parked_state(opt) as moved:
        assert moved == sum(len(s) for s in opt.state.values())
        assert all(v.device.type == "cpu" and v.is_pinned() for s in opt.state.values() for v in s.values())
        assert held - torch.cuda.memory_allocated() >= state_bytes  # (the allocator counts 512-byte blocks)
    assert all(v.is_cuda for s in opt.state.values() for v in s.values())
    for a, b in zip(_step(model, opt, "cuda"), _step(twin, twin_opt, "cuda")):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
