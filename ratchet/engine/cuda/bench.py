"""Speed of the CUDA backend on Qwen2.5-0.5B shapes with random weights, beside references
measured in the same run.

    PYTHONPATH=. python3 -m ratchet.engine.cuda.bench --out bench.json

- decode: ms per step at B=64 (128-token prompts, 256 forced new tokens, sampled on the GPU):
  the wall per step overlapped as the engine runs it (step t + 1 launched, its tokens fed on
  the GPU, before step t's are read; the same tokens as the plain run, checked), the wall per
  plain `decode_sample` call (launch, wait, read), and graph replay alone (CUDA events), with
  the memory bandwidth that implies (weights + KV cache read once per step) against ~4.2 TB/s;
- throughput: tokens/s at B=512 (prefill of 512 x 128 tokens packed, then 256 decode steps,
  overlapped; plain beside it);
- hf: transformers `generate` (Qwen2ForCausalLM, random init, fp16) at B=64, ms per step
  from (t(32 new) - t(1 new)) / 31;
- sync: the trainer's 494M fp32 parameters into the engine in place (DLPack, rounded on the
  GPU) against save-and-reload (fp16 safetensors through the host);
- sampler: 64 x 151936 logits, ours (one pass, Gumbel-max) against torch sort-based top-p;
  ours timed three ways: per launch in a CUDA graph of 20 (how the decode step runs it), one
  launch from Python between two events (adds the ~20 us Python launch), and 20 back to back.
Medians after warm-up. torch is imported here (the references and the trainer's tensors),
never by the engine itself.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import traceback

import cupy as cp
import numpy as np

from ratchet.engine.cuda.headline import headline
from ratchet.model.config import ModelConfig
from ratchet.model.layout import expected_shapes

HBM_TBPS = 4.2  # device-to-device copy measured on this machine kind (docs/GPU.md)


def qwen05_config() -> ModelConfig:
    return ModelConfig(arch="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                       num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, qkv_bias=True, eos_token_ids=[])


def random_torch_weights(cfg: ModelConfig, seed: int = 0) -> dict:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if "norm" in name:
            t = 1.0 + 0.05 * torch.randn(shape, device="cuda", generator=gen)
        elif name.endswith("bias"):
            t = 0.05 * torch.randn(shape, device="cuda", generator=gen)
        else:
            t = (0.1 if name == "embed.weight" else 0.02) * torch.randn(shape, device="cuda", generator=gen)
        out[name] = t.contiguous()
    torch.cuda.synchronize()
    return out


class Events:
    """CUDA-event timing on a CuPy stream: `with ev.time(stream): ...`, then ev.ms."""

    def __init__(self):
        self.ms: list[float] = []

    def time(self, stream):
        ev = self

        class _Ctx:
            def __enter__(self):
                self.start, self.end = cp.cuda.Event(), cp.cuda.Event()
                self.start.record(stream)

            def __exit__(self, *exc):
                self.end.record(stream)
                self.end.synchronize()
                ev.ms.append(cp.cuda.get_elapsed_time(self.start, self.end))

        return _Ctx()


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
    tokens, _ = backend.sample(first, [seed] * batch, slots, [0] * batch, [1.0] * batch, [False] * batch)
    step_s, drawn = [], []
    ones, falses, seeds = [1.0] * batch, [False] * batch, [seed] * batch
    if not overlap:
        for step in range(1, new_tokens):
            t = time.perf_counter()
            tokens, _ = backend.decode_sample(slots, tokens, [prompt_len + step - 1] * batch, seeds, slots,
                                              [step] * batch, ones, falses)
            step_s.append(time.perf_counter() - t)
            drawn.append(tokens)
    else:
        feed = list(range(batch))
        t = time.perf_counter()
        pending = backend.decode_sample_async(slots, tokens, [prompt_len] * batch, seeds, slots, [1] * batch,
                                              ones, falses)
        for step in range(2, new_tokens + 1):
            nxt = backend.decode_sample_async(slots, tokens, [prompt_len + step - 1] * batch, seeds, slots,
                                              [step] * batch, ones, falses, feed=feed) if step < new_tokens else None
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
    b = next(x for x in backend.buckets if x >= batch)
    graph = backend._graph(b, True, 0)

    def replay():
        if graph is not None:
            graph.launch(backend.stream)
        else:
            with backend.stream:
                backend._decode_body(b, True, 0)

    ev = Events()
    for _ in range(5):
        replay()
    for _ in range(30):
        with ev.time(backend.stream):
            replay()
    replay_ms = float(np.median(ev.ms))
    weight_bytes = sum(int(w.nbytes) for w in backend.weights.values())
    kv_per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * backend.storage.itemsize
    mean_ctx = prompt_len + new_tokens / 2
    step_bytes = weight_bytes + batch * mean_ctx * kv_per_token
    last_bytes = weight_bytes + batch * (prompt_len + new_tokens) * kv_per_token
    return {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "graphs": graph is not None, "graph_error": backend.graph_error,
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

    b = next(x for x in backend.buckets if x >= batch)
    graph = backend._graph(b, True, 0)
    backend.stream.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            if graph is not None:
                graph.launch(backend.stream)
            else:
                with backend.stream:
                    backend._decode_body(b, True, 0)
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
    """The same decode through `Engine` (prefill_batch with logits copied to the host and
    sampled by the NumPy sampler, then decode steps with the engine's own bookkeeping), with
    its steps overlapped (the default) and plain, the same tokens checked."""
    from types import SimpleNamespace

    from ratchet.engine.engine import Engine
    from ratchet.engine.request import Request

    model = SimpleNamespace(cfg=cfg, weights=weights_torch, dtype="fp16")
    out, outputs = {"batch": batch, "new_tokens": new_tokens}, {}
    for overlap in (True, False):
        engine = Engine(model, backend="cuda", max_batch_size=batch, max_seq_len=prompt_len + new_tokens,
                        overlap=overlap)
        rng = np.random.default_rng(seed)
        reqs = [Request(i, rng.integers(0, cfg.vocab_size, prompt_len).tolist(), max_new_tokens=new_tokens,
                        seed=seed) for i in range(batch)]
        for r in reqs:
            engine.add(r)
        t = time.perf_counter()
        engine.step()  # admits and prefills everything, first decode
        t_first = time.perf_counter() - t
        step_s = []
        while engine.num_unfinished:
            t = time.perf_counter()
            engine.step()
            step_s.append(time.perf_counter() - t)
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


def bench_hf(batch=64, prompt_len=128, new_tokens=32, seed=0) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.float16).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device="cuda")
    mask = torch.ones_like(ids)

    def gen(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=n,
                                 min_new_tokens=n, pad_token_id=0, eos_token_id=None)
        torch.cuda.synchronize()
        assert out.shape[1] == prompt_len + n, out.shape
        return time.perf_counter() - t

    gen(2)  # warm-up
    t1 = [gen(1) for _ in range(2)]
    tn = gen(new_tokens)
    step_ms = 1e3 * (tn - min(t1)) / (new_tokens - 1)
    del model
    torch.cuda.empty_cache()
    return {"batch": batch, "new_tokens": new_tokens, "generate_1_s": min(t1), f"generate_{new_tokens}_s": tn,
            "step_ms": step_ms, "tokens_per_s": batch * 1e3 / step_ms}


SYNC_WARMUP, SYNC_REPEATS = 5, 15


def bench_sync(backend, weights_torch: dict) -> dict:
    import torch

    from ratchet.model import safetensors_io

    n_params = sum(int(t.numel()) for t in weights_torch.values())
    # Warm-up first: run right after the HF section (launch-bound, the GPU mostly idle) the
    # first syncs took up to 1.6 ms against 1.15-1.2 ms at steady state (H200), the clocks
    # still ramping. In training a sync follows the optimizer step, on a busy GPU.
    times = []
    for _ in range(SYNC_WARMUP + SYNC_REPEATS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        backend.update_weights(weights_torch)
        times.append(time.perf_counter() - t)
    inplace = float(np.median(times[SYNC_WARMUP:]))
    out = {"params": n_params, "inplace_s": inplace,
           "inplace_GBps (fp32 read + 16-bit write)": n_params * (4 + backend.storage.itemsize) / inplace / 1e9}
    # the conversion kernel alone (one launch over every tensor), CUDA events on the engine's stream
    items = list(weights_torch.items())
    ev = Events()
    for i in range(SYNC_WARMUP + SYNC_REPEATS):
        with backend.stream:
            if i < SYNC_WARMUP:
                backend.weight_sync.copy(items)
                continue
            with ev.time(backend.stream):
                backend.weight_sync.copy(items)
    kernel_ms = float(np.median(ev.ms))
    out.update({"inplace_events_ms (WeightSync.copy call, GPU clock)": kernel_ms,
                "inplace_events_TBps": n_params * (4 + backend.storage.itemsize) / (kernel_ms * 1e-3) / 1e12})
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
    out["speedup"] = out["reload_total_s"] / inplace
    return out


def bench_sampler(rows=64, vocab=151936, seed=0) -> dict:
    import torch

    from ratchet.engine.cuda import sampler as gpu_sampler

    t = time.perf_counter()
    table = gpu_sampler.gumbel_table()
    t_table = time.perf_counter() - t
    rng = np.random.default_rng(seed)
    logits = cp.asarray((rng.standard_normal((rows, vocab)) * 3).astype(np.float32))
    params = cp.asarray(gpu_sampler.pack_params(np.arange(rows), np.arange(rows), np.zeros(rows), np.ones(rows),
                                                np.zeros(rows, bool)))
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


def bench(batch: int = 64, big_batch: int = 512, prompt_len: int = 128, new_tokens: int = 256,
          hf_new_tokens: int = 32, dtype: str = "fp16",
          sections=("decode", "profile", "throughput", "profile_big", "engine", "hf", "sync", "sampler"),
          seed: int = 0) -> dict:
    """Each section's figures (or its error); see the module docstring."""
    from ratchet.engine.cuda import launch
    from ratchet.engine.cuda.backend import CudaBackend

    results: dict = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "dtype": dtype,
                     "programmatic_dependent_launch": launch.enabled()}
    cfg = qwen05_config()
    backend = weights = None
    if {"decode", "profile", "throughput", "profile_big", "engine", "sync"} & set(sections):
        t = time.perf_counter()
        weights = random_torch_weights(cfg, seed)
        backend = CudaBackend(cfg, dtype, max(batch, big_batch), prompt_len + new_tokens)
        backend.load_weights(weights)
        results["setup_s"] = time.perf_counter() - t
    for name in sections:
        t = time.perf_counter()
        try:
            if name == "decode":
                results[name] = bench_decode(backend, batch, prompt_len, new_tokens, seed)
            elif name == "profile":
                results[name] = profile_decode(backend, batch)
            elif name == "throughput":
                results[name] = bench_throughput(backend, big_batch, prompt_len, new_tokens, seed + 1)
            elif name == "profile_big":  # the B=512 step, at the context the throughput run left
                results[name] = profile_decode(backend, big_batch)
            elif name == "engine":
                results[name] = bench_engine(cfg, weights, batch, prompt_len, 64, seed)
            elif name == "hf":
                results[name] = bench_hf(batch, prompt_len, hf_new_tokens, seed)
            elif name == "sync":
                results[name] = bench_sync(backend, weights)
            elif name == "sampler":
                results[name] = bench_sampler(batch, cfg.vocab_size, seed)
        except Exception as e:  # one broken section must not hide the others
            results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        results.setdefault(name, {})["section_s"] = time.perf_counter() - t
        print(f"[bench] {name}: {json.dumps(results[name], default=float)[:2000]}", flush=True)
    key = "step_ms_median (wall, overlapped as the engine runs)"
    if "decode" in results and "hf" in results and "step_ms" in results["hf"] and key in results["decode"]:
        results["decode_speedup_vs_hf"] = results["hf"]["step_ms"] / results["decode"][key]
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--sections", default="decode,profile,throughput,profile_big,engine,hf,sync,sampler")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--big-batch", type=int, default=512)
    args = ap.parse_args()
    res = bench(batch=args.batch, big_batch=args.big_batch, dtype=args.dtype, sections=args.sections.split(","))
    res["headline"] = headline(res)
    text = json.dumps(res, indent=2, default=float)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
