"""Every CUDA kernel against the NumPy backend's layers and sampler on fresh random inputs
(activations rounded where the kernels store them; exact kernels bit for bit): `selftest()`
returns {kernel: {"max_err", "mean_err", "rel_err", "tol", "ok"}, "ok", "passed"} and raises
on a miss unless `raise_on_fail=False`."""

from __future__ import annotations

import cupy as cp
import numpy as np

from ratchet.engine import sampler as np_sampler
from ratchet.engine.cuda import sampler as gpu_sampler
from ratchet.engine.cuda.ops import STORAGE, Ops, convert, decode_split
from ratchet.engine.cuda.plan import SPLIT_K
from ratchet.engine.numpy.layers import apply_rope, attention, rms_norm, silu_mul
from ratchet.engine.sampling import SamplingBatch
from ratchet.model.dtypes import bf16_bits_to_fp32, fp32_to_bf16_bits, round_to

# relative-error tolerance per dtype for kernels whose fp32 sums may run in another order
TOL = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}


def to_gpu(x: np.ndarray, dtype: str) -> cp.ndarray:
    """fp32 values (already on the dtype grid) into engine storage on the GPU."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp16":
        return cp.asarray(x.astype(np.float16))
    if dtype == "bf16":
        return cp.asarray(fp32_to_bf16_bits(x))
    return cp.asarray(x)


def to_host(x: cp.ndarray, dtype: str) -> np.ndarray:
    """Engine storage on the GPU -> fp32 NumPy."""
    h = cp.asnumpy(x)
    if dtype == "bf16":
        return bf16_bits_to_fp32(h)
    return h.astype(np.float32)


def _grid(rng: np.random.Generator, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    return round_to(rng.standard_normal(shape).astype(np.float32) * np.float32(scale), dtype)


def compare(out: np.ndarray, ref: np.ndarray, tol: float, exact: bool = False) -> dict:
    out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    finite = bool(np.all(np.isfinite(out64)))
    diff = np.abs(out64 - ref64)
    norm = float(np.linalg.norm(ref64))
    rel = float(np.linalg.norm(out64 - ref64) / norm) if norm else float(np.linalg.norm(out64 - ref64))
    ok = finite and (bool(np.array_equal(out64, ref64)) if exact else rel <= tol)
    return {"max_err": float(diff.max()) if diff.size else 0.0, "mean_err": float(diff.mean()) if diff.size else 0.0,
            "rel_err": rel, "tol": 0.0 if exact else tol, "ok": ok}


def _merge(*results: dict) -> dict:
    """Worst of several checks of one kernel."""
    return {"max_err": max(r["max_err"] for r in results), "mean_err": float(np.mean([r["mean_err"] for r in results])),
            "rel_err": max(r["rel_err"] for r in results), "tol": max(r["tol"] for r in results),
            "ok": all(r["ok"] for r in results)}


def check_embedding(ops: Ops, rng) -> dict:
    vocab, dim, rows = 1000, 896, 37
    table = _grid(rng, (vocab, dim), ops.dtype)
    tokens = rng.integers(0, vocab, rows).astype(np.int32)
    out = cp.full((rows, dim), 0x7E00 if ops.dtype != "fp32" else np.nan, dtype=ops.storage)  # poisoned
    ops.embedding(cp.asarray(tokens), to_gpu(table, ops.dtype), out)
    plain = compare(to_host(out, ops.dtype), table[tokens], 0, exact=True)
    # fed rows (feed > 0) take the previous step's token at row feed - 1
    prev = rng.integers(0, vocab, 50).astype(np.int32)
    feed = np.where(rng.random(rows) < 0.5, rng.integers(1, 51, rows), 0).astype(np.int32)
    want = np.where(feed > 0, prev[np.maximum(feed - 1, 0)], tokens)
    ops.embedding(cp.asarray(tokens), to_gpu(table, ops.dtype), out, cp.asarray(feed), cp.asarray(prev))
    return _merge(plain, compare(to_host(out, ops.dtype), table[want], 0, exact=True))


def check_staging(ops: Ops, rng) -> dict:
    """copy_rows between mapped pinned host memory and the GPU, pitches and a column subset."""
    from ratchet.engine.cuda.staging import mapped

    rows, pitch, cols = 10, 96, 37
    pinned = cp.cuda.alloc_pinned_memory(rows * pitch * 4)
    host = np.frombuffer(pinned, np.int32, rows * pitch).reshape(rows, pitch)
    host[:] = rng.integers(-2**31, 2**31, (rows, pitch), dtype=np.int64).astype(np.int32)
    dev = cp.full((rows, pitch + 5), -7, dtype=np.int32)
    ops.copy_rows(mapped(pinned.ptr), pitch, dev, pitch + 5, rows, cols)
    back_pinned = cp.cuda.alloc_pinned_memory(rows * pitch * 4)
    back = np.frombuffer(back_pinned, np.int32, rows * pitch).reshape(rows, pitch)
    back[:] = 3
    ops.copy_rows(dev, pitch + 5, mapped(back_pinned.ptr), pitch, rows, cols)
    cp.cuda.runtime.deviceSynchronize()
    got = cp.asnumpy(dev)
    want = np.full((rows, pitch + 5), -7, dtype=np.int32)
    want[:, :cols] = host[:, :cols]
    want_back = np.full((rows, pitch), 3, dtype=np.int32)
    want_back[:, :cols] = host[:, :cols]
    return _merge(compare(got, want, 0, exact=True), compare(back, want_back, 0, exact=True))


# a width for each kernel plan.rms_norm_kernel chooses (16-bit types): a warp a row (Qwen2.5-0.5B),
# a vector a thread (Coder-1.5B, Qwen2.5-7B), and the block kernel (off the 16-byte grid)
RMSNORM_WIDTHS = (896, 1536, 3584, 2604)


def check_rmsnorm(ops: Ops, rng) -> dict:
    """Each rmsnorm kernel: plain, with a delta, and with a split product's slices."""
    return _merge(*(check_rmsnorm_dim(ops, rng, d) for d in RMSNORM_WIDTHS),
                  *(check_rmsnorm_parts(ops, rng, d) for d in RMSNORM_WIDTHS))


def check_rmsnorm_dim(ops: Ops, rng, dim: int) -> dict:
    rows, eps = 19, 1e-6
    dt = ops.dtype
    res, delta = _grid(rng, (rows, dim), dt), _grid(rng, (rows, dim), dt, 0.5)
    weight = _grid(rng, (dim,), dt, 0.2) + round_to(np.float32(1.0), dt)
    weight = round_to(weight, dt)
    g_res, out = to_gpu(res, dt), cp.empty((rows, dim), dtype=ops.storage)
    ops.add_rmsnorm(g_res, to_gpu(delta, dt), to_gpu(weight, dt), out, eps)
    ref_res = round_to(res + delta, dt)
    ref_out = round_to(rms_norm(ref_res, weight, eps), dt)
    exact_add = compare(to_host(g_res, dt), ref_res, 0, exact=True)
    normed = compare(to_host(out, dt), ref_out, TOL[dt])
    out2 = cp.empty((rows, dim), dtype=ops.storage)  # no residual add (layer 0)
    ops.add_rmsnorm(to_gpu(res, dt), None, to_gpu(weight, dt), out2, eps)
    plain = compare(to_host(out2, dt), round_to(rms_norm(res, weight, eps), dt), TOL[dt])
    return _merge(exact_add, normed, plain)


def check_rmsnorm_parts(ops: Ops, rng, dim: int) -> dict:
    """The delta as gemm_split's fp32 slices: summed in slice order, rounded to the storage,
    added."""
    rows, eps, dt = 19, 1e-6, ops.dtype
    res = _grid(rng, (rows, dim), dt)
    parts = (rng.standard_normal((SPLIT_K, rows, dim)) * 0.3).astype(np.float32)
    weight = round_to(_grid(rng, (dim,), dt, 0.2) + round_to(np.float32(1.0), dt), dt)
    g_res, out = to_gpu(res, dt), cp.empty((rows, dim), dtype=ops.storage)
    ops.add_rmsnorm(g_res, None, to_gpu(weight, dt), out, eps, parts=cp.asarray(parts))
    total = parts[0].copy()
    for p in parts[1:]:
        total += p  # float32, in slice order, as the kernel sums
    ref_res = round_to(res + round_to(total, dt), dt)
    return _merge(compare(to_host(g_res, dt), ref_res, 0, exact=True),
                  compare(to_host(out, dt), round_to(rms_norm(ref_res, weight, eps), dt), TOL[dt]))


def check_rope(ops: Ops, rng, num_heads: int, num_kv_heads: int) -> dict:
    from ratchet.model.config import ModelConfig
    from ratchet.model.layout import rope_tables

    dt, hd = ops.dtype, ops.head_dim
    cfg = ModelConfig("qwen2", 64, 64, 64, 1, num_heads, num_kv_heads, hd, rope_theta=1e6)
    max_seq, slots_n, rows = 300, 5, 11
    cos, sin = rope_tables(cfg, max_seq)
    width = (num_heads + 2 * num_kv_heads) * hd
    qkv = (rng.standard_normal((rows, width)) * 2).astype(np.float32)
    bias = _grid(rng, (width,), dt, 0.3)
    positions = rng.integers(0, max_seq, rows).astype(np.int32)
    slots = rng.permutation(slots_n)[:rows % slots_n + 3].astype(np.int32)
    slots = np.resize(slots, rows).astype(np.int32)
    positions[: len(positions)] = positions  # distinct (slot, position) pairs below
    pairs = {}
    for i in range(rows):
        pairs[(slots[i], positions[i])] = i
    keep = np.array(sorted(pairs.values()))
    qkv, positions, slots = qkv[keep], positions[keep], slots[keep]
    rows = len(keep)
    cache = cp.zeros((slots_n, 2, num_kv_heads, max_seq, hd), dtype=ops.storage)
    q_out = cp.empty((rows, num_heads * hd), dtype=ops.storage)
    ops.rope_qkv(cp.asarray(qkv), to_gpu(bias, dt), cp.asarray(cos), cp.asarray(sin), cp.asarray(positions),
                 cp.asarray(slots), q_out, cache, num_heads, num_kv_heads)
    x = round_to(qkv + bias, dt)
    q, k, v = np.split(x, [num_heads * hd, (num_heads + num_kv_heads) * hd], -1)
    c, s = cos[positions], sin[positions]
    ref_q = round_to(apply_rope(q.reshape(rows, num_heads, hd), c, s), dt).reshape(rows, -1)
    ref_k = round_to(apply_rope(k.reshape(rows, num_kv_heads, hd), c, s), dt)
    host_cache = to_host(cache, dt)
    got_k = host_cache[slots, 0, :, positions]  # [rows, K, hd]
    got_v = host_cache[slots, 1, :, positions]
    return _merge(compare(to_host(q_out, dt), ref_q, 0, exact=True),
                  compare(got_k, ref_k, 0, exact=True),
                  compare(got_v, v.reshape(rows, num_kv_heads, hd), 0, exact=True))


def check_swiglu(ops: Ops, rng) -> dict:
    dt, rows, inter = ops.dtype, 13, 4864
    gu = _grid(rng, (rows, 2 * inter), dt, 3.0)
    out = cp.empty((rows, inter), dtype=ops.storage)
    ops.swiglu(to_gpu(gu, dt), out)
    ref = round_to(silu_mul(gu[:, :inter], gu[:, inter:]), dt)
    return compare(to_host(out, dt), ref, TOL[dt])


def check_gemm(ops: Ops, rng) -> dict:
    dt = ops.dtype
    results = []
    for rows, n, k in ((1, 1152, 896), (64, 4864, 896), (37, 896, 4864)):
        x, w = _grid(rng, (rows, k), dt), _grid(rng, (n, k), dt, 0.05)
        out32 = cp.empty((rows, n), dtype=np.float32)
        ops.gemm(to_gpu(x, dt), to_gpu(w, dt), out32)
        ref = x.astype(np.float64) @ w.astype(np.float64).T
        results.append(compare(cp.asnumpy(out32), ref, 1e-5))
        out16 = cp.empty((rows, n), dtype=ops.storage)
        ops.gemm(to_gpu(x, dt), to_gpu(w, dt), out16)
        results.append(compare(to_host(out16, dt), round_to(ref.astype(np.float32), dt), TOL[dt]))
        if k % SPLIT_K == 0:  # K in slices: each slice's product, and their sum
            parts = cp.empty((SPLIT_K, rows, n), dtype=np.float32)
            ops.gemm_split(to_gpu(x, dt), to_gpu(w, dt), parts)
            ks = k // SPLIT_K
            ref_parts = np.stack([x[:, i * ks:(i + 1) * ks].astype(np.float64)
                                  @ w[:, i * ks:(i + 1) * ks].astype(np.float64).T for i in range(SPLIT_K)])
            results.append(compare(cp.asnumpy(parts), ref_parts, 1e-5))
            results.append(compare(cp.asnumpy(parts).sum(0, dtype=np.float64), ref, 1e-5))
    return _merge(*results)


def _random_cache(rng, dt, slots_n, num_kv_heads, max_seq, hd):
    host = _grid(rng, (slots_n, 2, num_kv_heads, max_seq, hd), dt)
    return host, to_gpu(host, dt)


def _attention_ref(q, host_cache, slot, positions, dt):
    """q [R, H, hd] of one slot's rows at `positions`; reference from the NumPy backend's layer."""
    n = int(positions.max()) + 1
    n_pad = -(-n // 64) * 64
    keys = np.zeros((1,) + host_cache.shape[2:3] + (n_pad, host_cache.shape[-1]), np.float32)
    values = np.zeros_like(keys)
    keys[0, :, :n] = host_cache[slot, 0, :, :n]
    values[0, :, :n] = host_cache[slot, 1, :, :n]
    return round_to(attention(q, keys, values, positions), dt)


def check_attention_decode(ops: Ops, rng, num_kv_heads: int, max_seq: int) -> dict:
    dt, hd, g = ops.dtype, ops.head_dim, ops.group
    num_heads = num_kv_heads * g
    slots_n, rows = 6, 5
    host_cache, cache = _random_cache(rng, dt, slots_n, num_kv_heads, max_seq, hd)
    slots = rng.permutation(slots_n)[:rows].astype(np.int32)
    seq_lens = rng.integers(1, max_seq + 1, rows).astype(np.int32)
    seq_lens[0], seq_lens[1] = 1, max_seq  # the edges
    q = _grid(rng, (rows, num_heads * hd), dt)
    _, nsplit = decode_split(max_seq)
    part_acc = cp.empty((rows, num_kv_heads, nsplit, g, hd), dtype=np.float32)
    part_ml = cp.empty((rows, num_kv_heads, nsplit, g, 2), dtype=np.float32)
    out = cp.empty((rows, num_heads * hd), dtype=ops.storage)
    ops.attention_decode(to_gpu(q, dt), cache, cp.asarray(slots), cp.asarray(seq_lens), part_acc, part_ml, out)
    ref = np.concatenate([_attention_ref(q[r:r + 1].reshape(1, num_heads, hd), host_cache, slots[r],
                                         np.array([seq_lens[r] - 1]), dt).reshape(1, -1) for r in range(rows)])
    return compare(to_host(out, dt), ref, TOL[dt])


def check_attention_decode_rope(ops: Ops, rng, num_kv_heads: int, max_seq: int) -> dict:
    """The fused kernel (attention_decode_rope) against rope_qkv then attention_decode on the
    same inputs: the cache (the new k, v) and the output bit for bit."""
    dt, hd, g = ops.dtype, ops.head_dim, ops.group
    num_heads = num_kv_heads * g
    slots_n, rows = 6, 5
    _, cache = _random_cache(rng, dt, slots_n, num_kv_heads, max_seq, hd)
    slots = cp.asarray(rng.permutation(slots_n)[:rows].astype(np.int32))
    seq_lens = rng.integers(1, max_seq + 1, rows).astype(np.int32)
    seq_lens[0], seq_lens[1] = 1, max_seq
    width = (num_heads + 2 * num_kv_heads) * hd
    qkv = cp.asarray(rng.standard_normal((rows, width)).astype(np.float32))
    bias = to_gpu(_grid(rng, (width,), dt, 0.1), dt)
    angles = rng.uniform(0, 2 * np.pi, (max_seq, hd // 2))
    cos, sin = cp.asarray(np.cos(angles).astype(np.float32)), cp.asarray(np.sin(angles).astype(np.float32))
    _, nsplit = decode_split(max_seq)
    outs, caches = [], []
    for fused in (False, True):
        c = cache.copy()
        part_acc = cp.empty((rows, num_kv_heads, nsplit, g, hd), dtype=np.float32)
        part_ml = cp.empty((rows, num_kv_heads, nsplit, g, 2), dtype=np.float32)
        out = cp.empty((rows, num_heads * hd), dtype=ops.storage)
        lens = cp.asarray(seq_lens)
        if fused:
            ops.attention_decode_rope(qkv, bias, cos, sin, c, slots, lens, part_acc, part_ml, out)
        else:
            q = cp.empty((rows, num_heads * hd), dtype=ops.storage)
            ops.rope_qkv(qkv, bias, cos, sin, lens - 1, slots, q, c, num_heads, num_kv_heads)
            ops.attention_decode(q, c, slots, lens, part_acc, part_ml, out)
        outs.append(to_host(out, dt))
        caches.append(cp.asnumpy(c.view(np.uint16) if dt != "fp32" else c))
    same_cache = bool(np.array_equal(caches[0], caches[1]))
    result = compare(outs[1], outs[0], 0, exact=True)
    result["ok"] = result["ok"] and same_cache
    return result


def check_attention_prefill(ops: Ops, rng, num_kv_heads: int) -> dict:
    dt, hd, g = ops.dtype, ops.head_dim, ops.group
    num_heads = num_kv_heads * g
    max_seq, slots_n = 320, 4
    host_cache, cache = _random_cache(rng, dt, slots_n, num_kv_heads, max_seq, hd)
    seqs = [(2, 0, 37), (0, 100, 70), (3, 5, 1), (1, 0, 131)]  # (slot, start, rows)
    total = sum(n for _, _, n in seqs)
    q = _grid(rng, (total, num_heads * hd), dt)
    seq_rows, r = [], 0
    for slot, start, n in seqs:
        seq_rows.append((r, n, slot, start))
        r += n
    tiles, qt = ops.prefill_tiles(seq_rows)
    out = cp.full((total, num_heads * hd), 0x7E00 if dt != "fp32" else np.nan, dtype=ops.storage)
    ops.attention_prefill(to_gpu(q, dt), cache, cp.asarray(tiles), qt, out)
    refs = []
    for (row0, n, slot, start) in seq_rows:
        positions = np.arange(start, start + n)
        refs.append(_attention_ref(q[row0:row0 + n].reshape(n, num_heads, hd), host_cache, slot, positions,
                                   dt).reshape(n, -1))
    return compare(to_host(out, dt), np.concatenate(refs), TOL[dt])


def check_sampler(rng, rows: int = 16, vocab: int = 151936) -> dict:
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    logits[3, 1000:1010] = logits[3].max() + 5  # a tie for the greedy argmax: first index wins
    seeds = rng.integers(0, 2**40, rows)
    request_ids = rng.integers(0, 2**32, rows)
    token_indices = rng.integers(0, 5000, rows)
    temperatures = rng.uniform(0.3, 1.5, rows).astype(np.float32)
    greedy = np.zeros(rows, dtype=bool)
    greedy[[1, 3]] = True
    temperatures[1] = 0.0
    batch = SamplingBatch(seeds, request_ids, token_indices, temperatures, greedy)
    ref_tokens, ref_logprobs = np_sampler.sample(logits, batch)
    tokens, logprobs = gpu_sampler.sample(cp.asarray(logits), batch)
    same = compare(cp.asnumpy(tokens).astype(np.float64), ref_tokens.astype(np.float64), 0, exact=True)
    lp = compare(cp.asnumpy(logprobs), ref_logprobs, 1e-6)
    lp["max_err"] = max(lp["max_err"], same["max_err"])
    lp["ok"] = lp["ok"] and same["ok"]
    lp["tokens_equal"] = same["ok"]
    return lp


def check_convert(rng) -> dict:
    n = 1 << 20
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))).astype(np.float32)
    bits = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    x[:4096] = bits.view(np.float32)  # every kind of pattern: subnormals, ties, inf, NaN
    x[4096:4100] = [np.inf, -np.inf, 65520.0, 65519.99]
    src = cp.asarray(x)
    ok, worst = True, 0.0
    for dt in ("fp16", "bf16"):
        dst = cp.empty(n, dtype=STORAGE[dt])
        convert(src, dst, dt)
        got = cp.asnumpy(dst)
        with np.errstate(over="ignore"):  # overflow to inf is part of the check
            want = x.astype(np.float16).view(np.uint16) if dt == "fp16" else fp32_to_bf16_bits(x)
        got_bits = got.view(np.uint16)
        nan = np.isnan(x)
        same = np.array_equal(got_bits[~nan], want[~nan])
        # NaN stays NaN (payload aside): the exponent is all ones and the mantissa non-zero
        exp_mask, man_mask = (0x7C00, 0x03FF) if dt == "fp16" else (0x7F80, 0x007F)
        nan_ok = bool(np.all(((got_bits[nan] & exp_mask) == exp_mask) & ((got_bits[nan] & man_mask) != 0)))
        ok = ok and same and nan_ok
        worst = max(worst, float(np.count_nonzero(got_bits[~nan] != want[~nan])))
    return {"max_err": worst, "mean_err": 0.0, "rel_err": 0.0, "tol": 0.0, "ok": ok}


def selftest(dtype: str = "fp16", shapes=((64, 14, 2),), seed: int | None = None,
             raise_on_fail: bool = True) -> dict:
    """Check every kernel for `dtype` and each attention shape (head_dim, heads, kv_heads).

    Fresh random inputs each call (seed None). Returns per-kernel errors and "ok"."""
    rng = np.random.default_rng(seed)
    results: dict = {}
    for hd, heads, kv_heads in shapes:
        ops = Ops(dtype, hd, heads // kv_heads)
        tag = f"[hd={hd},H={heads},K={kv_heads}]"
        if not results:
            results["embedding"] = check_embedding(ops, rng)
            results["staging"] = check_staging(ops, rng)
            results["rmsnorm"] = check_rmsnorm(ops, rng)
            results["swiglu"] = check_swiglu(ops, rng)
            results["gemm"] = check_gemm(ops, rng)
        results[f"rope{tag}"] = check_rope(ops, rng, heads, kv_heads)
        results[f"attention_decode{tag}"] = _merge(check_attention_decode(ops, rng, kv_heads, 300),
                                                   check_attention_decode(ops, rng, kv_heads, 2500))
        if ops.fused_rope_decode:
            results[f"attention_decode_rope{tag}"] = _merge(check_attention_decode_rope(ops, rng, kv_heads, 300),
                                                            check_attention_decode_rope(ops, rng, kv_heads, 2500))
        results[f"attention_prefill{tag}"] = check_attention_prefill(ops, rng, kv_heads)
        ops.close()
    results["sampler"] = check_sampler(rng)
    results["convert"] = check_convert(rng)
    cp.cuda.runtime.deviceSynchronize()
    failed = [k for k, v in results.items() if not v["ok"]]
    results["ok"] = results["passed"] = not failed
    if failed and raise_on_fail:
        detail = "; ".join(f"{k}: rel {results[k]['rel_err']:.3g} max {results[k]['max_err']:.3g} "
                           f"(tol {results[k]['tol']:.3g})" for k in failed)
        raise RuntimeError(f"CUDA kernel selftest ({dtype}) failed: {detail}")
    return results


def format_results(results: dict) -> str:
    lines = [f"{'kernel':42s} {'max_err':>10s} {'mean_err':>10s} {'rel_err':>10s} {'tol':>9s}  ok"]
    for k, v in results.items():
        if not isinstance(v, dict):
            continue
        lines.append(f"{k:42s} {v['max_err']:10.3g} {v['mean_err']:10.3g} {v['rel_err']:10.3g} {v['tol']:9.2g}  "
                     f"{'yes' if v['ok'] else 'NO'}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    for dt in (sys.argv[1:] or ["fp16", "bf16", "fp32"]):
        res = selftest(dt, shapes=((64, 14, 2), (128, 16, 4)), raise_on_fail=False)
        print(f"== {dt}: {'PASS' if res['ok'] else 'FAIL'}")
        print(format_results(res))
