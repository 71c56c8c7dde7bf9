"""The process a GRPO worker runs in: thread counts, determinism, its device, and the
worker processes it starts (torch.multiprocessing). torch is imported where it is used: the
stages that only gather tables import this module for its timers, and a process start that
imports torch costs ~3 s on a small CPU."""

from __future__ import annotations

import os
import sys
import threading
import time

SMALL_MODEL_PARAMS = 50_000_000  # below this one torch thread beats several (start-up, spinning)


def configure_threads(model_cfg, num_processes: int = 1) -> None:
    """One torch thread for a small model; else this process' share of the cores. (A fixed
    choice per setting: the thread count can change float sums, so reruns must agree.)"""
    import torch

    from ratchet.model.layout import num_parameters

    if num_parameters(model_cfg) < SMALL_MODEL_PARAMS:
        torch.set_num_threads(1)
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, (cores or 1) // num_processes))


def set_determinism(seed: int) -> None:
    import torch

    from ratchet.trainer.dynamo_import import import_dynamo

    import_dynamo()  # use_deterministic_algorithms would import it with the caller's frames in a cycle
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS on GPU
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)


def worker_device(trainer_device: str, rank: int, world: int) -> tuple[str, str, int | None]:
    """(torch device of this worker's trainer, torch.distributed backend, the GPU its engine
    runs on): NCCL when every worker has a GPU of its own, else gloo (CPU tensors)."""
    import torch

    if trainer_device == "cpu":
        return "cpu", "gloo", None
    if torch.cuda.device_count() >= world:
        torch.cuda.set_device(rank)
        return f"cuda:{rank}", "nccl", rank
    return "cuda", "gloo", None


class Timer:
    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        t, self.t0 = self.t0, time.perf_counter()
        return self.t0 - t


class Laps:
    """Named laps of a run's fixed costs (its start-up, its outputs), said in one line: what a
    training rule spends beyond its steps, which at 1.5B was ~100 s of 250. On a GPU it also
    notes which laps raised each allocator's high-water mark and by how much (`rises_line`):
    the phase that sets a rule's peak, which the peak alone does not say (at 1.5B the
    ablations' 89-102 GiB keep them from running beside a training)."""

    def __init__(self, highs=None):
        from ratchet.gpu_memory import gpu_highs_gib

        highs = gpu_highs_gib if highs is None else highs
        self.timer, self.laps = Timer(), {}
        self._highs, self.high = highs, highs()
        self.rises: dict[str, dict[str, float]] = {}  # allocator -> lap -> GiB it rose in that lap

    def __call__(self, name: str) -> None:
        """The seconds since the last lap (or the start) go to `name`, and so does any rise of
        an allocator's high-water mark since then."""
        self.laps[name] = self.laps.get(name, 0.0) + self.timer()
        for allocator, now in self._highs().items():
            rise = now - self.high.get(allocator, 0.0)
            if rise > 0:
                by_lap = self.rises.setdefault(allocator, {})
                by_lap[name] = by_lap.get(name, 0.0) + rise
                self.high[allocator] = now

    @property
    def total(self) -> float:
        return sum(self.laps.values())

    def line(self) -> str:
        return f"{self.total:.1f} s (" + ", ".join(f"{k} {v:.1f} s" for k, v in self.laps.items()) + ")"

    def rises_line(self) -> str:
        """'torch 81.4 GiB, from ...: gradients +26.3, ...; cupy pool ...' ('' off the GPU): each
        allocator's high-water mark, what it was before the first lap, and the laps that raised it."""
        parts = []
        for allocator, by_lap in self.rises.items():
            start = self.high[allocator] - sum(by_lap.values())
            parts.append(f"{allocator} {self.high[allocator]:.1f} GiB, from {start:.1f}: "
                         + ", ".join(f"{k} +{v:.1f}" for k, v in sorted(by_lap.items(), key=lambda kv: -kv[1])))
        return "; ".join(parts)


def _spawned(index: int, fn, first_rank: int, args: tuple, env: dict[str, str]) -> None:
    os.environ.update(env)  # before anything touches CUDA in this process
    fn(first_rank + index, *args)


class Workers:
    """Ranks `ranks` as processes (torch.multiprocessing, spawned), running `fn(rank, *args)`
    while this process runs rank 0 itself. Rank 0 blocks in collectives with them, where
    ProcessContext.join cannot be called, and NCCL would wait for a dead peer until the
    group's timeout: so a thread joins them, and exits this process when one fails."""

    def __init__(self, fn, args: tuple, ranks: range, env: dict[str, str] | None = None):
        import torch.multiprocessing as mp

        self.context = mp.start_processes(_spawned, args=(fn, ranks.start, args, env or {}),
                                          nprocs=len(ranks), join=False, start_method="spawn")
        self.closing, self.error = threading.Event(), None
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        try:
            while not self.context.join(timeout=0.5):
                pass
        except Exception as error:  # ProcessRaisedException / ProcessExitedException
            self.error = error
            if not self.closing.is_set():
                print(f"a worker failed; stopping: {error}", file=sys.stderr, flush=True)
                os._exit(1)

    def close(self, failed: bool) -> None:
        """Wait for the workers (kill them if this process `failed`)."""
        self.closing.set()
        if failed:
            for p in self.context.processes:
                if p.is_alive():
                    p.kill()
        self.watcher.join()
        if self.error is not None and not failed:
            raise RuntimeError(f"a worker failed: {self.error}") from self.error
        if self.error is not None:  # this process's error may only be the echo of the worker's
            print(f"a worker failed too: {self.error}", file=sys.stderr, flush=True)
