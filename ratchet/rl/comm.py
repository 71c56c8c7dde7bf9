"""The collectives the loops need (torch.distributed), and JSON messages between processes:
plain data crosses as JSON, never pickle."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import torch


class Comm:
    """The collectives the loops need; a no-op for one worker."""

    def __init__(self, rank: int = 0, world: int = 1, group=None, device="cpu"):
        self.rank, self.world, self.group = rank, world, group
        self.device = torch.device(device)  # where collective tensors live (cuda for NCCL)

    def sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, group=self.group)
        return t.cpu().tolist()

    def max(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return float(t.cpu())

    def cat(self, x: np.ndarray) -> np.ndarray:
        """Every worker's 1-D float64 array, concatenated in rank order."""
        if self.world == 1:
            return x
        parts = self._all_gather_padded(torch.from_numpy(np.asarray(x, np.float64)))
        return np.concatenate([p.numpy() for p in parts])

    def _all_gather_padded(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every worker's 1-D tensor (lengths may differ), on the CPU, in rank order."""
        dev = self.device
        sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(self.world)]
        torch.distributed.all_gather(sizes, torch.tensor([len(x)], device=dev), group=self.group)
        n = max(int(s) for s in sizes)
        padded = torch.zeros(n, dtype=x.dtype, device=dev)
        padded[:len(x)] = x.to(dev)
        parts = [torch.zeros(n, dtype=x.dtype, device=dev) for _ in range(self.world)]
        torch.distributed.all_gather(parts, padded, group=self.group)
        return [p[:int(s)].cpu() for p, s in zip(parts, sizes)]

    def digest(self, h: bytes) -> str:
        """One SHA-256 over every worker's digest, in rank order."""
        if self.world == 1:
            return h.hex()
        parts = self._all_gather_padded(torch.frombuffer(bytearray(h), dtype=torch.uint8))
        return hashlib.sha256(b"".join(bytes(p.numpy()) for p in parts)).hexdigest()

    def gather_json(self, obj) -> list:
        """Every worker's JSON-able object, in rank order (no pickle)."""
        if self.world == 1:
            return [obj]
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        parts = self._all_gather_padded(data)
        return [json.loads(bytes(p.numpy()).decode()) for p in parts]

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        if self.world == 1:
            return
        for p in params:
            if p.grad is None:  # a worker that held no answer yet ran no backward: it adds zeros
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.device)  # one collective, not one per tensor
        torch.distributed.all_reduce(flat, group=self.group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(rank: int, world: int, port: int, backend: str = "gloo") -> None:
    from datetime import timedelta

    torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world, timeout=timedelta(minutes=30))


def send_json(obj, dst: int) -> None:
    payload = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
    torch.distributed.send(torch.tensor([payload.numel()], dtype=torch.int64), dst)
    torch.distributed.send(payload, dst)


def recv_json(src: int):
    size = torch.zeros(1, dtype=torch.int64)
    torch.distributed.recv(size, src)
    payload = torch.empty(int(size), dtype=torch.uint8)
    torch.distributed.recv(payload, src)
    return json.loads(bytes(payload.numpy()).decode())
