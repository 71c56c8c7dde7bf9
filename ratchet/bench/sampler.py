"""The GPU sampler (one pass, Gumbel-max) against torch's sort-based top-p on the same logits,
ours timed as the decode graph runs it, from Python, and back to back."""

from __future__ import annotations

import time

import cupy as cp
import numpy as np

from ratchet.bench.workload import Events
from ratchet.engine.cuda import sampler as gpu_sampler
from ratchet.engine.sampling import SamplingBatch


def bench_sampler(rows=64, vocab=151936, seed=0) -> dict:
    import torch

    t = time.perf_counter()
    table = gpu_sampler.gumbel_table()
    t_table = time.perf_counter() - t
    rng = np.random.default_rng(seed)
    logits = cp.asarray((rng.standard_normal((rows, vocab)) * 3).astype(np.float32))
    batch = SamplingBatch(np.arange(rows), np.arange(rows), np.zeros(rows), np.ones(rows), np.zeros(rows, bool))
    params = cp.asarray(gpu_sampler.pack_params(batch))
    tokens, logprobs = cp.empty(rows, np.int32), cp.empty(rows, np.float32)
    work = gpu_sampler.workspace(rows)
    stream = cp.cuda.get_current_stream()
    ev = Events()
    for i in range(60):
        if i < 10:
            gpu_sampler.launch(logits, params, tokens, logprobs, table, work)
            continue
        with ev.time(stream):
            gpu_sampler.launch(logits, params, tokens, logprobs, table, work)
    ours = float(np.median(ev.ms))
    ev_many = Events()  # 20 launches back to back: the kernel's own time, launch overhead hidden
    for i in range(5):
        with ev_many.time(stream):
            for _ in range(20):
                gpu_sampler.launch(logits, params, tokens, logprobs, table, work)
    back_to_back = float(np.median(ev_many.ms)) / 20
    # as the decode step runs it: 20 launches captured in a CUDA graph, no Python between them
    graph_stream = cp.cuda.Stream(non_blocking=True)
    with graph_stream:
        graph_stream.begin_capture()
        for _ in range(20):
            gpu_sampler.launch(logits, params, tokens, logprobs, table, work)
        graph = graph_stream.end_capture()
    ev_graph = Events()
    for i in range(12):
        with ev_graph.time(graph_stream):
            graph.launch(graph_stream)
    in_graph = float(np.median(ev_graph.ms[2:])) / 20
    tl = torch.from_dlpack(logits)

    def top_p(x, p=0.9, temperature=1.0):
        probs = torch.softmax(x / temperature, dim=-1)
        sp, si = torch.sort(probs, dim=-1, descending=True)
        cum = sp.cumsum(-1)
        sp = sp.masked_fill(cum - sp > p, 0.0)
        pick = torch.multinomial(sp / sp.sum(-1, keepdim=True), 1)
        return si.gather(-1, pick)

    times = []
    for i in range(40):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        top_p(tl)
        e.record()
        e.synchronize()
        if i >= 10:
            times.append(s.elapsed_time(e))
    theirs = float(np.median(times))
    return {"rows": rows, "vocab": vocab, "ours_ms_in_graph": in_graph, "ours_ms": ours,
            "ours_ms_back_to_back": back_to_back, "torch_top_p_sort_ms": theirs, "speedup": theirs / ours,
            "gumbel_table_build_s": t_table,
            "ours_GBps (logits read)": rows * vocab * 4 / (ours * 1e-3) / 1e9}
