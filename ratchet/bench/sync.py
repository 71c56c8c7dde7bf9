"""The trainer's weights into the engine in place (DLPack, rounded on the GPU) against
save-and-reload (16-bit safetensors through the host)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

import numpy as np

from ratchet.bench.workload import Events
from ratchet.model import safetensors_io
from ratchet.model.flat_weights import FlatWeights

SYNC_WARMUP, SYNC_REPEATS = 5, 15


def _wall_s(backend, weights) -> float:
    """One `update_weights` call, host work and the wait for the GPU included: median after warm-up."""
    import torch

    times = []
    for _ in range(SYNC_WARMUP + SYNC_REPEATS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        backend.update_weights(weights)
        times.append(time.perf_counter() - t)
    return float(np.median(times[SYNC_WARMUP:]))


def _back_to_back_ms(stream, launch, repeats: int = SYNC_REPEATS) -> float:
    """The GPU time of one `launch()`, host work excluded: one launch to fill the queue, then
    `repeats` back to back between two events, so the GPU never waits for the host (each
    launch's host work is shorter than its kernel) and the events see kernels alone."""
    import cupy as cp

    with stream:
        launch()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(repeats):
            launch()
        end.record(stream)
        end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / repeats


def kernels_alone_ms(backend, flat) -> dict[str, float]:
    """The one-range kernels and torch's fp32 -> 16-bit copy, each as GPU time alone
    (`_back_to_back_ms`): `kernels_events_ms` times each around a WeightSync.copy call of ~170
    tensors, whose host work the GPU waits for, while torch's copy is one launch; this compares
    the kernels on equal terms. Medians of 5 rounds, the variants in rotation within a round."""
    import dataclasses

    import cupy as cp
    import torch

    from ratchet.engine.cuda import sync

    buffer = backend.flat_weights
    variants = {"convert_f32": 0, "convert_tiles, 1 load": 1, "convert_tiles, 2 loads": 2,
                "convert_tiles, 4 loads": 4, "convert_tiles, 8 loads": 8}
    syncs = {name: sync.WeightSync({"flat": buffer}, backend.dtype,
                                   kernel=dataclasses.replace(sync.DEFAULT_KERNEL, range_loads=loads))
             for name, loads in variants.items()}
    half = torch.empty(flat.numel(), device="cuda", dtype=torch.float16 if backend.dtype == "fp16" else torch.bfloat16)
    torch_stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    launches = {**{name: (backend.stream, lambda ws=ws: ws.copy([("flat", flat)])) for name, ws in syncs.items()},
                "torch_flat_copy": (torch_stream, lambda: half.copy_(flat))}
    rounds = {name: [] for name in launches}
    torch.cuda.synchronize()
    for _ in range(5):
        for name, (stream, launch) in launches.items():
            rounds[name].append(_back_to_back_ms(stream, launch))
    torch.cuda.synchronize()
    return {name: float(np.median(ms)) for name, ms in rounds.items()}


def _events_ms(stream, call) -> float:
    """One `call()`, host work included, CUDA events on `stream`: median after warm-up."""
    ev = Events()
    for i in range(SYNC_WARMUP + SYNC_REPEATS):
        with stream:
            if i < SYNC_WARMUP:
                call()
                continue
            with ev.time(stream):
                call()
    return float(np.median(ev.ms))


def _copy_events_ms(backend, weight_sync, items) -> float:
    """One WeightSync.copy of `items`, CUDA events on the engine's stream."""
    return _events_ms(backend.stream, lambda: weight_sync.copy(items))


def compare_kernels(backend, items) -> dict[str, float]:
    """Each conversion kernel on the same sync (CUDA events, medians), and torch's own
    fp32 -> 16-bit copy of one flat tensor of as many values: the ceiling of an element-wise
    kernel on this GPU, since it reads and writes the same bytes with no descriptors."""
    import torch

    from ratchet.engine.cuda import sync

    K = sync.SyncKernel
    kernels = {"search": sync.SEARCH, "default (one range: convert_tiles, 2 loads)": sync.DEFAULT_KERNEL,
               "one range: convert_f32": dataclasses.replace(sync.DEFAULT_KERNEL, range_loads=0),
               "table-8192-per-chunk-plain": K("table", 8192, 4, stream=False, per_chunk=True),
               "table-8192": K("table", 8192, 4), "table-8192-plain": K("table", 8192, 4, stream=False),
               "table-8192-per-chunk": K("table", 8192, 4, per_chunk=True),
               "table-4096-per-chunk": K("table", 4096, 4, per_chunk=True),
               "table-4096-per-chunk-plain": K("table", 4096, 4, stream=False, per_chunk=True),
               "table-2048-per-chunk": K("table", 2048, 8, per_chunk=True),
               "table-2048-per-chunk-plain": K("table", 2048, 8, stream=False, per_chunk=True),
               "table-1024-per-chunk-plain": K("table", 1024, 8, stream=False, per_chunk=True),
               "default without one range (the table kernel over the flat range's chunks)":
                   dataclasses.replace(sync.DEFAULT_KERNEL, one_range=False),
               "one range: convert_tiles, 4 loads": dataclasses.replace(sync.DEFAULT_KERNEL, range_loads=4)}
    out = {name: _copy_events_ms(backend, sync.WeightSync(backend.weights, backend.dtype, kernel=kernel), items)
           for name, kernel in kernels.items()}
    # the same sync from masters in separate allocations (the layout before flat_offsets): no
    # two tensors coalesce, so the default kernel takes its table path
    apart = [(name, torch.empty(t.numel() + 64, device="cuda")[:t.numel()].view(t.shape).copy_(t))
             for name, t in items]  # 64 spare values each: never adjacent
    out["default, masters in separate allocations"] = _copy_events_ms(
        backend, sync.WeightSync(backend.weights, backend.dtype), apart)
    del apart
    n = sum(int(t.numel()) for _, t in items)
    flat = torch.randn(n, device="cuda")
    half = torch.empty(n, device="cuda", dtype=torch.float16 if backend.dtype == "fp16" else torch.bfloat16)
    times = []
    for i in range(SYNC_WARMUP + SYNC_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        half.copy_(flat)
        end.record()
        end.synchronize()
        if i >= SYNC_WARMUP:
            times.append(start.elapsed_time(end))
    out["torch_flat_copy"] = float(np.median(times))
    del flat, half
    return out


def bench_sync(backend, weights_torch: FlatWeights) -> dict:
    """The trainer's masters as the colocated sync passes them (FlatWeights: one buffer) and as
    a mapping of ~170 views (how any other caller passes them), wall time of the call; then
    each conversion kernel and torch's copy."""
    n_params = sum(int(t.numel()) for t in weights_torch.values())
    # warm-up first: after the HF section the GPU's clocks are still ramping (docs/KERNELS.md)
    inplace = _wall_s(backend, dict(weights_torch))
    flat_s = _wall_s(backend, weights_torch)
    out = {"params": n_params, "inplace_s": inplace, "inplace_flat_s": flat_s,
           "inplace_GBps (fp32 read + 16-bit write)": n_params * (4 + backend.storage.itemsize) / inplace / 1e9}
    out["inplace_flat_events_ms (update_weights call, FlatWeights, GPU clock)"] = _events_ms(
        backend.stream, lambda: backend.update_weights(weights_torch))
    out["kernels_alone_ms"] = kernels_alone_ms(backend, weights_torch.flat)
    # the conversion kernel (one launch over every tensor), CUDA events on the engine's stream
    items = list(weights_torch.items())
    kernel_ms = _copy_events_ms(backend, backend.weight_sync, items)
    out.update({"inplace_events_ms (WeightSync.copy call, GPU clock)": kernel_ms,
                "inplace_events_TBps": n_params * (4 + backend.storage.itemsize) / (kernel_ms * 1e-3) / 1e12})
    out["kernels_events_ms"] = compare_kernels(backend, items)
    with tempfile.TemporaryDirectory(dir=os.environ.get("RATCHET_BENCH_TMP")) as tmp:
        path = os.path.join(tmp, "model.safetensors")
        t = time.perf_counter()
        host = {k: v.cpu().numpy() for k, v in weights_torch.items()}
        t_d2h = time.perf_counter() - t
        t = time.perf_counter()
        safetensors_io.save(path, host, backend.dtype)
        t_save = time.perf_counter() - t
        del host
        t = time.perf_counter()
        loaded = safetensors_io.load_fp32(path)
        t_load = time.perf_counter() - t
        t = time.perf_counter()
        backend.update_weights(loaded)
        t_upload = time.perf_counter() - t
    out.update({"reload_d2h_s": t_d2h, "reload_save_s": t_save, "reload_load_s": t_load,
                "reload_upload_s": t_upload, "reload_total_s": t_d2h + t_save + t_load + t_upload})
    out["speedup"] = out["reload_total_s"] / flat_s
    return out
