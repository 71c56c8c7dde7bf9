"""The CUDA backend's decode step and throughput, timed as the engine runs them (overlapped)
and plainly, with the same tokens checked both ways; the graph replay alone; the kernels of
one step (torch.profiler)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import cupy as cp
import numpy as np

from ratchet.bench.engine_steps import timed_steps
from ratchet.bench.workload import Events
from ratchet.engine.engine import Engine
from ratchet.engine.request import Request
from ratchet.engine.sampling import SamplingBatch

HBM_TBPS = 4.2  # the H200's device-to-device copy bandwidth (docs/KERNELS.md)


def _generate(backend, batch: int, prompt_len: int, new_tokens: int, seed: int, overlap: bool = False) -> dict:
    """Prefill, then new_tokens - 1 decode steps. Plain: each `decode_sample` waited for, its
    wall timed. Overlap (as the engine runs): step t + 1 launched with its tokens fed on the
    GPU before step t's are read; a step's time is from one result to the next."""
    cfg = backend.cfg
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, cfg.vocab_size, prompt_len).tolist() for _ in range(batch)]
    slots = list(range(batch))
    backend.reset()
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    first = backend.prefill_batch(slots, prompts, device=True)
    t_prefill = time.perf_counter() - t0

    def rows(token_index: int) -> SamplingBatch:
        return SamplingBatch([seed] * batch, slots, [token_index] * batch, [1.0] * batch, [False] * batch)

    tokens, _ = backend.sample(first, rows(0))
    step_s, drawn = [], []
    if not overlap:
        for step in range(1, new_tokens):
            t = time.perf_counter()
            tokens, _ = backend.decode_sample(slots, tokens, [prompt_len + step - 1] * batch, rows(step))
            step_s.append(time.perf_counter() - t)
            drawn.append(tokens)
    else:
        feed = list(range(batch))
        t = time.perf_counter()
        pending = backend.decode_sample_async(slots, tokens, [prompt_len] * batch, rows(1))
        for step in range(2, new_tokens + 1):
            nxt = backend.decode_sample_async(slots, tokens, [prompt_len + step - 1] * batch, rows(step),
                                              feed=feed) if step < new_tokens else None
            drawn.append(pending.result()[0])
            now = time.perf_counter()
            step_s.append(now - t)
            t, pending = now, nxt
    return {"prefill_s": t_prefill, "steps_s": step_s, "first_step_s": step_s[0], "tokens": np.stack(drawn),
            "decode_s": float(np.sum(step_s)), "median_step_ms": 1e3 * float(np.median(step_s[1:]))}


def bench_decode(backend, batch=64, prompt_len=128, new_tokens=256, seed=0) -> dict:
    cfg = backend.cfg
    run = _generate(backend, batch, prompt_len, new_tokens, seed)
    ahead = _generate(backend, batch, prompt_len, new_tokens, seed, overlap=True)
    # graph replay alone at the last context, CUDA events
    replay = backend.replay_decode
    ev = Events()
    for _ in range(5):
        graphs = replay(batch)
    for _ in range(30):
        with ev.time(backend.stream):
            replay(batch)
    replay_ms = float(np.median(ev.ms))
    weight_bytes = sum(int(w.nbytes) for w in backend.weights.values())
    kv_per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * backend.storage.itemsize
    mean_ctx = prompt_len + new_tokens / 2
    step_bytes = weight_bytes + batch * mean_ctx * kv_per_token
    last_bytes = weight_bytes + batch * (prompt_len + new_tokens) * kv_per_token
    return {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "graphs": graphs, "graph_error": backend.graph_error,
            "prefill_ms": 1e3 * run["prefill_s"], "first_step_ms (graph capture)": 1e3 * run["first_step_s"],
            "step_ms_median (wall, decode_sample)": run["median_step_ms"],
            "step_ms_median (wall, overlapped as the engine runs)": ahead["median_step_ms"],
            "overlapped_tokens_equal": bool(np.array_equal(ahead["tokens"], run["tokens"])),
            "step_ms_graph_replay (ctx %d)" % (prompt_len + new_tokens): replay_ms,
            "tokens_per_s (decode)": batch * (new_tokens - 1) / run["decode_s"],
            "weight_GB": weight_bytes / 1e9, "bytes_per_step_GB (mean ctx)": step_bytes / 1e9,
            "bandwidth_TBps (wall median)": step_bytes / (run["median_step_ms"] * 1e-3) / 1e12,
            "bandwidth_TBps (overlapped wall median)": step_bytes / (ahead["median_step_ms"] * 1e-3) / 1e12,
            "bandwidth_TBps (replay, last ctx)": last_bytes / (replay_ms * 1e-3) / 1e12,
            "bandwidth_fraction_of_4.2 (wall)": step_bytes / (run["median_step_ms"] * 1e-3) / 1e12 / HBM_TBPS}


def profile_decode(backend, batch=64, steps=10, top=24) -> dict:
    """Per-kernel GPU time of one decode step (graph replays traced by torch.profiler / CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    backend.replay_decode(batch)  # captured outside the trace
    backend.stream.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            backend.replay_decode(batch)
        backend.stream.synchronize()
    rows = []
    for evt in prof.key_averages():
        us = getattr(evt, "device_time_total", None)
        if us is None:
            us = getattr(evt, "cuda_time_total", 0.0)
        if us:
            rows.append((evt.key[:90], us / steps, evt.count / steps))
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    return {"batch": batch, "kernel_us_per_step_total": total,
            "kernels (name, us/step, launches/step)": [(k, round(us, 2), round(n, 1)) for k, us, n in rows[:top]]}


def bench_throughput(backend, batch=512, prompt_len=128, new_tokens=256, seed=1) -> dict:
    """B = 512: overlapped as the engine runs (the figure), and plain beside it."""
    run = _generate(backend, batch, prompt_len, new_tokens, seed, overlap=True)
    plain = _generate(backend, batch, prompt_len, new_tokens, seed)
    total = run["prefill_s"] + run["decode_s"]
    return {"batch": batch, "prefill_s": run["prefill_s"],
            "prefill_tokens_per_s": batch * prompt_len / run["prefill_s"],
            "step_ms_median": run["median_step_ms"], "decode_s": run["decode_s"],
            "tokens_per_s (decode)": batch * (new_tokens - 1) / run["decode_s"],
            "tokens_per_s (prefill + decode)": batch * new_tokens / total,
            "tokens_per_s (decode, plain decode_sample)": batch * (new_tokens - 1) / plain["decode_s"],
            "overlapped_tokens_equal": bool(np.array_equal(run["tokens"], plain["tokens"]))}


def bench_engine(cfg, weights_torch: dict, batch=64, prompt_len=128, new_tokens=64, seed=0) -> dict:
    """The same decode through `Engine` (its bookkeeping on top of the backend's steps), with
    its steps overlapped (the default) and plain, the same tokens checked."""
    model = SimpleNamespace(cfg=cfg, weights=weights_torch, dtype="fp16")
    out, outputs = {"batch": batch, "new_tokens": new_tokens}, {}
    for overlap in (True, False):
        engine = Engine(model, backend="cuda", max_batch_size=batch, max_seq_len=prompt_len + new_tokens,
                        overlap=overlap)
        rng = np.random.default_rng(seed)
        reqs = [Request(i, rng.integers(0, cfg.vocab_size, prompt_len).tolist(), max_new_tokens=new_tokens,
                        seed=seed) for i in range(batch)]
        t_first, step_s, _ = timed_steps(engine, reqs)
        tag = "overlapped" if overlap else "plain"
        out[f"step_ms_median ({tag})"] = 1e3 * float(np.median(step_s[1:]))
        out[f"tokens_per_s (engine stats, {tag})"] = engine.stats.tokens_per_s
        if overlap:
            out["first_step_s (prefill, host sampling of its logits, graph capture)"] = t_first
        outputs[overlap] = [r.output for r in reqs]
        out[f"all_lengths_ok ({tag})"] = all(len(r.output) == new_tokens for r in reqs)
        del engine
    out["same_tokens_both_ways"] = outputs[True] == outputs[False]
    return out
