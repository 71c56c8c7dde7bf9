"""GPU memory as nvidia-smi sees it: each GPU's total, and the most one process held. Both come
from the driver, not from torch or CuPy, so they count every allocator and the CUDA context:
what another job on the same GPU actually loses."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import threading

TOTAL_ENV = "RATCHET_GPU_MEMORY_GIB"  # the GiB ratchet's jobs may use on each GPU (default: its total)
ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def register_threads(cores: int | None = None) -> int:
    """Threads that touch a pinned allocation's pages before it is registered: the largest power
    of two (torch requires one, at most 128) up to the cores, and no more than 16."""
    cores = max(1, min(16, cores or os.cpu_count() or 1))
    return 1 << (cores.bit_length() - 1)


# torch's allocator, unless the user set one: segments that grow in place instead of a new
# block per size, so variable-length micro-batches do not leave the reserved memory (what
# another job on the GPU loses) far above the allocated; and pinned host memory as pages that
# threads fault in before one cudaHostRegister, where cudaHostAlloc faults them one thread
# (AdamW's moments parked by ablate_decompose: 14 GB at 1.5B, dev/gpu/parking_probe.py).
# Numerics are untouched.
ALLOC_DEFAULT = ("expandable_segments:True,pinned_use_cuda_host_register:True,"
                 f"pinned_num_register_threads:{register_threads()}")


def allocator_defaults() -> None:
    """Set ALLOC_ENV to ALLOC_DEFAULT where it is unset; called before the stage starts CUDA
    (torch reads it at its first allocation). A user's own setting, even empty, is kept."""
    os.environ.setdefault(ALLOC_ENV, ALLOC_DEFAULT)


def smi_rows(*query: str) -> list[list[str]]:
    """nvidia-smi's CSV rows for a query, or [] where it is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if "," in line]


def gpu_totals_gib(gpus: list[str]) -> dict[str, float]:
    """Each GPU's memory in GiB, the GPUs named as CUDA_VISIBLE_DEVICES names them (an index or a
    UUID); RATCHET_GPU_MEMORY_GIB caps every GPU at that figure (a GPU shared with other work).
    GPUs nvidia-smi cannot name are left out."""
    cap = os.environ.get(TOTAL_ENV)
    if cap:
        try:
            value = float(cap)
        except ValueError:
            raise ValueError(f"{TOTAL_ENV}={cap!r}: expected GiB as a number") from None
        return dict.fromkeys(gpus, value)
    totals = {}
    for index, uuid, mib in smi_rows("--query-gpu=index,uuid,memory.total"):
        totals[index] = totals[uuid] = float(mib) / 1024
    return {g: totals[g] for g in gpus if g in totals}


def process_used_mib(pid: int) -> float | None:
    """The GPU memory (MiB) the process `pid` holds now over all GPUs, or None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    return sum(float(mib) for p, mib in smi_rows("--query-compute-apps=pid,used_memory") if p == str(pid))


class ProcessPeak:
    """The most GPU memory a process held, sampled in the background every `every_s` seconds
    (nvidia-smi: context and every allocator counted). `stop()` returns it in GiB, or None
    where nvidia-smi is missing."""

    def __init__(self, pid: int | None = None, every_s: float = 1.0):
        self.pid, self.every_s, self.peak_mib, self.stopped = pid or os.getpid(), every_s, None, False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, name="ratchet-gpu-peak", daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while True:
            used = process_used_mib(self.pid)
            if used is None:
                return
            self.peak_mib = max(self.peak_mib or 0.0, used)
            if self.done.wait(self.every_s):
                return

    def stop(self) -> float | None:
        """The peak in GiB (None without nvidia-smi); stopping again returns it again, unsampled."""
        if not self.stopped:
            self.stopped = True
            self.done.set()
            self.thread.join()
            used = process_used_mib(self.pid)  # a last sample: a short stage may end between polls
            if used is not None:
                self.peak_mib = max(self.peak_mib or 0.0, used)
        return None if self.peak_mib is None else self.peak_mib / 1024


_cupy_pool_high = 0  # bytes: the most CuPy's pool held before a release_cupy_cache


def release_cupy_cache() -> None:
    """Hand the blocks CuPy's pool keeps after their arrays are gone back to the driver. The pool
    keeps them for a later allocation of the same size, but the next ablation run's engines do
    not reuse them all: at 1.5B ablate_fix's pool reached 25 GiB where one run's engines and
    sync telemetry hold 14, and a job beside it on the GPU loses what the pool keeps (verify's
    two modes in one process likewise). The pool's most is remembered for gpu_highs_gib. A no-op
    where CuPy is not imported or has no CUDA."""
    global _cupy_pool_high
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return
    try:
        pool = cupy.get_default_memory_pool()
        _cupy_pool_high = max(_cupy_pool_high, pool.total_bytes())
        pool.free_all_blocks()
    except RuntimeError:  # a CuPy without a usable CUDA (CUDARuntimeError): nothing held
        return


def return_gpu_memory() -> None:
    """What dropped objects held, and what torch's allocator keeps cached, back to the driver:
    arrays are freed once no name holds them (gc for any cycle), CuPy's pool keeps the blocks
    unless told (release_cupy_cache), and torch keeps what its last peak took reserved, where
    CuPy's next arrays (ablate_decompose's engines made again after its gradient passes) would
    otherwise be put on top of it, a peak above the passes' own."""
    gc.collect()
    release_cupy_cache()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def gpu_highs_gib() -> dict[str, float]:
    """The GPU allocators' high-water marks so far in GiB, for allocators this process already
    imported and started (asking must not start CUDA): torch's most allocated, and what CuPy's
    pool holds (it keeps freed blocks, so about its most; the most before a release_cupy_cache
    where that is more). {} where none was used."""
    highs = {}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        highs["torch"] = torch.cuda.max_memory_allocated() / 2 ** 30
    cupy = sys.modules.get("cupy")
    try:
        held = cupy.get_default_memory_pool().total_bytes() if cupy is not None else 0
    except RuntimeError:  # a CuPy without a usable CUDA (CUDARuntimeError): nothing held
        held = 0
    held = max(held, _cupy_pool_high)
    if held:
        highs["cupy pool"] = held / 2 ** 30
    return highs


def allocator_split() -> dict[str, float]:
    """Where a process's GPU memory went, by allocator, in GiB: torch's most allocated and most
    reserved (the gap is its cache and fragmentation), and what CuPy's pool holds
    (gpu_highs_gib). {} where none was used."""
    highs, split = gpu_highs_gib(), {}
    if "torch" in highs:
        import torch

        split["torch_allocated_gib"] = highs["torch"]
        split["torch_reserved_gib"] = torch.cuda.max_memory_reserved() / 2 ** 30
    if "cupy pool" in highs:
        split["cupy_pool_gib"] = highs["cupy pool"]
    return split
