"""The split mode's link between its trainer and its engine: plain-data messages both ways and
the weight broadcasts trainer -> engine. `ProcessLink`: two processes (two GPUs, or the CPU)
through torch.distributed (JSON messages; one flat fp32 broadcast over NCCL or gloo).
`ThreadLink`: one GPU, the engine on a thread of the trainer's process (a queue; the masters
copied on the GPU), so generating the next batch overlaps the trainer's step without the
weights' round trip through the host that two processes on one GPU would need (gloo)."""

from __future__ import annotations

import queue
import threading

import torch

from ratchet.rl.comm import recv_json, send_json
from ratchet.rl.sync import (
    WeightReceiver,
    WeightSender,
    flatten,
    for_engine,
    masters,
    unflatten,
)

TRAINER, ENGINE = 0, 1


class ProcessLink:
    """One end of the link between the trainer (rank 0) and the engine (rank 1) processes;
    the process group is initialised by the caller."""

    def __init__(self, rank: int):
        self.rank, self.peer = rank, ENGINE if rank == TRAINER else TRAINER
        self.group = self._sender = self._receiver = None

    def open_weights(self, backend: str) -> None:
        """The group the weights travel in; both ends call this after the start message.
        NCCL takes one rank per device, so only between two GPUs; else the default gloo group."""
        if backend == "nccl":
            self.group = torch.distributed.new_group([TRAINER, ENGINE], backend="nccl")

    def send(self, obj) -> None:
        send_json(obj, self.peer)

    def recv(self):
        return recv_json(self.peer)

    def send_weights(self, policy, weights: dict | None = None, async_op: bool = False):
        """Broadcast `weights` (default: the policy's masters); with `async_op` the handle to
        wait on before the next send."""
        if self._sender is None:
            self._sender = WeightSender(policy, self.group)
        return self._sender.send(TRAINER, async_op=async_op, weights=weights)

    def receive_weights_into(self, engine, model_cfg, device: str) -> None:
        if self._receiver is None:
            self._receiver = WeightReceiver(model_cfg, device=device, group=self.group)
        self._receiver.receive_into(engine, TRAINER)

    def close(self) -> None:
        torch.distributed.destroy_process_group()


class _Done:
    """The handle of a send that is already complete."""

    def wait(self) -> None:
        return None


class LinkClosed(RuntimeError):
    """The other end stopped (it failed, or the run is being torn down)."""


class ThreadLink:
    """One end of an in-process link; `ThreadLink.pair()` makes both. A broadcast is a new
    flat fp32 tensor where the masters live (the optimiser may change them right after), put
    on a queue; the engine's side rounds its views into its buffers. The copy is queued on
    the trainer's stream; the engine's DLPack exchange orders its own stream after it.
    Messages travel by reference, not as JSON: what is sent must be the sender's no longer
    (Group.to_dict copies the answers' lists, which the engine's next batch extends)."""

    def __init__(self, inbox: queue.Queue, outbox: queue.Queue, weights: queue.Queue,
                 closed: threading.Event, device: str):
        self.inbox, self.outbox, self.weights, self.closed = inbox, outbox, weights, closed
        self.device = device

    @classmethod
    def pair(cls, device: str) -> tuple["ThreadLink", "ThreadLink"]:
        """(the trainer's end, the engine's end)."""
        to_engine, to_trainer, weights, closed = queue.Queue(), queue.Queue(), queue.Queue(), threading.Event()
        return (cls(to_trainer, to_engine, weights, closed, device),
                cls(to_engine, to_trainer, weights, closed, device))

    def _get(self, q: queue.Queue):
        while True:
            try:
                item = q.get(timeout=0.5)
            except queue.Empty:
                if self.closed.is_set():
                    raise LinkClosed("split: the other side of the link stopped") from None
                continue
            if isinstance(item, BaseException):
                raise LinkClosed(f"split: the engine thread failed: {item!r}") from item
            return item

    def open_weights(self, backend: str) -> None:
        return None  # one process: the weights stay on the GPU

    def send(self, obj) -> None:
        self.outbox.put(obj)

    def recv(self):
        return self._get(self.inbox)

    def send_weights(self, policy, weights: dict | None = None, async_op: bool = False):
        weights = masters(policy) if weights is None else weights
        self.weights.put(flatten(weights).to(self.device))  # [P] fp32
        return _Done()

    def receive_weights_into(self, engine, model_cfg, device: str) -> None:
        engine.update_weights(for_engine(engine, unflatten(self._get(self.weights), model_cfg)))

    def fail(self, error: BaseException) -> None:
        """The engine thread's last act when it fails: the trainer's next recv raises it."""
        self.outbox.put(error)
        self.closed.set()

    def close(self) -> None:
        self.closed.set()
