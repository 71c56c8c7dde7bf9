"""Continuous batching: a waiting queue, and up to max_batch_size running sequences, each in
a slot (a row of the backend's KV cache), admitted in arrival order."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ratchet.engine.request import Request


@dataclass
class Sequence:
    """A running request and where its KV cache lives."""

    request: Request
    slot: int
    num_cached_tokens: int = 0  # positions of the slot holding this sequence's k, v


class Scheduler:
    def __init__(self, max_batch_size: int):
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Sequence] = {}  # by request_id, in admission order
        self.free_slots = list(range(max_batch_size - 1, -1, -1))  # a stack; slot 0 on top

    def __contains__(self, request_id: int) -> bool:
        return request_id in self.running or any(r.request_id == request_id for r in self.waiting)

    @property
    def is_idle(self) -> bool:
        return not self.waiting and not self.running

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def admit(self) -> list[Sequence]:
        """Move waiting requests into free slots; the new sequences still need a prefill."""
        admitted = []
        while self.waiting and self.free_slots:
            seq = Sequence(self.waiting.popleft(), self.free_slots.pop())
            self.running[seq.request.request_id] = seq
            admitted.append(seq)
        return admitted

    def release(self, seq: Sequence) -> None:
        del self.running[seq.request.request_id]
        self.free_slots.append(seq.slot)

    def remove_waiting(self, request_id: int) -> Request | None:
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                return request
        return None
