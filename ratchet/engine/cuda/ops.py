"""Launchers for the kernels in `kernels/*.cu` and the matrix products (cublas.py). Each checks
its arguments' shapes, dtypes and contiguity first (a wrong stride on the GPU is a silent
wrong answer) and launches on CuPy's current stream; scalars go as NumPy scalars of the
kernel's C type (CuPy passes a Python int as 64 bits)."""

from __future__ import annotations

import math

import cupy as cp
import numpy as np

from ratchet.engine.cuda import loader
from ratchet.engine.cuda.cublas import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_GEMM_DEFAULT,
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUDA_R,
    Cublas,
)
from ratchet.engine.cuda.launch import pdl_kernel
from ratchet.engine.cuda.plan import (
    DECODE_TILE,
    SPLIT_K,
    decode_split,
    mma_decode_plan,
    prefill_tiles,
    rms_norm_kernel,
)

STORAGE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}  # bf16 as its bit patterns
TAGS = loader.DTYPE_TAGS


def _i32(x) -> np.int32:
    return np.int32(x)


def _ptr(a):
    """An array, or a null pointer for None (passed as a 64-bit zero)."""
    return np.uint64(0) if a is None else a


def _addr(a):
    """A CuPy array as a kernel argument, or a raw device address (int) as a 64-bit pointer."""
    return a if isinstance(a, cp.ndarray) else np.uint64(a)


def _aligned16(*arrays: cp.ndarray) -> bool:
    """Every array starts on a 16-byte boundary (the vectorised kernels' loads)."""
    return all(a.data.ptr % 16 == 0 for a in arrays)


def _check(a: cp.ndarray, name: str, shape: tuple | None = None, dtype=None) -> None:
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{name}: expected a cupy array, got {type(a).__name__}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: must be C-contiguous (strides {a.strides})")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(a.shape)}, expected {tuple(shape)}")
    if dtype is not None and a.dtype != np.dtype(dtype):
        raise ValueError(f"{name}: dtype {a.dtype}, expected {np.dtype(dtype)}")


class Ops:
    """The kernels of one engine dtype and one attention shape (head_dim, group)."""

    def __init__(self, dtype: str, head_dim: int, group: int):
        if dtype not in STORAGE:
            raise ValueError(f"cuda ops: dtype {dtype!r} is not one of {tuple(STORAGE)}")
        self.dtype, self.head_dim, self.group = dtype, head_dim, group
        self.storage = np.dtype(STORAGE[dtype])
        attn = ((head_dim, group),)
        names = ("embedding", "rope", "swiglu", "attention_decode", "attention_prefill")
        specs = [(name, loader.expressions(name, (dtype,), attn)) for name in names]
        norm_exprs = loader.expressions("rmsnorm", (dtype,))
        # every module an engine launches (the sampler's too), compiled at once where the cache is cold
        *modules, norm, _, _, _ = loader.load_many(specs + [("rmsnorm", norm_exprs),
                                                            ("convert", loader.expressions("convert")),
                                                            ("staging", ()), ("sampler", ())])
        fn = {}
        for (name, exprs), module in zip(specs, modules):
            fn.update({e.split("<")[0]: module.get_function(e) for e in exprs})
        fn = {k: pdl_kernel(v) for k, v in fn.items()}  # programmatic dependent launch (launch.py)
        self.f_rmsnorm = pdl_kernel(norm.get_function(norm_exprs[0]))
        self.f_rmsnorm_fast = {(k, p): pdl_kernel(norm.get_function(f"add_rmsnorm_{k}<{TAGS[dtype]}, {p}>"))
                               for k in ("warp", "row") for p in (0, SPLIT_K)}
        self.f_embedding, self.f_swiglu_vec = fn["embedding"], fn["swiglu_vec"]
        self.f_rope, self.f_swiglu = fn["rope_qkv"], fn["swiglu"]
        self.vec = 16 // self.storage.itemsize  # values per 16-byte vector
        self.f_decode_partial, self.f_decode_combine = fn["attn_decode_partial"], fn["attn_decode_combine"]
        self.f_prefill = fn["attn_prefill"]
        self.f_decode_mma = fn.get("attn_decode_mma")  # tensor cores where the shape allows
        convert_module = loader.load("convert", loader.expressions("convert"))
        self.f_convert = {"fp16": convert_module.get_function("convert_f32<0>"),
                          "bf16": convert_module.get_function("convert_f32<1>")}
        self.f_copy_rows = pdl_kernel(loader.load("staging").get_function("copy_rows"))
        self.blas = Cublas()
        self._one = np.ones(1, dtype=np.float32)
        self._zero = np.zeros(1, dtype=np.float32)

    def close(self) -> None:
        if getattr(self, "blas", None) is not None:
            self.blas.close()
            self.blas = None

    # ---------------------------------------------------------------- matrix product

    def gemm(self, x: cp.ndarray, w: cp.ndarray, out: cp.ndarray, x_dtype: str | None = None,
             out_dtype: str | None = None) -> None:
        """out[R, N] = x[R, K] @ w[N, K]^T with fp32 accumulation (cuBLAS gemmEx).

        x and w in the engine dtype; out in the engine dtype or fp32 (logits, qkv)."""
        rows, k = x.shape
        n = w.shape[0]
        _check(x, "gemm x", dtype=self.storage)
        _check(w, "gemm w", (n, k), self.storage)
        out_dtype = out_dtype or ("fp32" if out.dtype == np.float32 else self.dtype)
        _check(out, "gemm out", (rows, n), STORAGE[out_dtype])
        if rows == 0:
            return
        self.blas.set_stream(cp.cuda.get_current_stream().ptr)
        # column-major view: out^T [n, rows] = w [k, n]^T @ x^T [k, rows]
        self.blas.gemm_ex(CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k,
                          self._one.ctypes.data, w.data.ptr, CUDA_R[self.dtype], k,
                          x.data.ptr, CUDA_R[self.dtype], k,
                          self._zero.ctypes.data, out.data.ptr, CUDA_R[out_dtype], n,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)

    def gemm_split(self, x: cp.ndarray, w: cp.ndarray, parts: cp.ndarray) -> None:
        """parts[s] = x[:, s K/S : (s+1) K/S] @ w[:, same]^T in fp32, s < S = parts.shape[0]: the
        product with K split into S slices, one strided-batched cuBLAS call (S times the blocks of
        one M = 64 product, which alone leaves most multiprocessors idle); add_rmsnorm (`parts`)
        sums the S slices in order, so no reduction kernel runs."""
        rows, k = x.shape
        n = w.shape[0]
        s = parts.shape[0]
        _check(x, "gemm_split x", dtype=self.storage)
        _check(w, "gemm_split w", (n, k), self.storage)
        _check(parts, "gemm_split parts", (s, rows, n), np.float32)
        if k % s or (k // s) % 8:
            raise ValueError(f"gemm_split: K = {k} does not split into {s} slices of a multiple of 8")
        if rows == 0:
            return
        ks = k // s
        self.blas.set_stream(cp.cuda.get_current_stream().ptr)
        self.blas.gemm_strided_batched_ex(CUBLAS_OP_T, CUBLAS_OP_N, n, rows, ks,
                                          self._one.ctypes.data, w.data.ptr, CUDA_R[self.dtype], k, ks,
                                          x.data.ptr, CUDA_R[self.dtype], k, ks,
                                          self._zero.ctypes.data, parts.data.ptr, CUDA_R["fp32"], n, rows * n, s,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)

    # ---------------------------------------------------------------- element-wise

    def copy_rows(self, src, src_pitch: int, dst, dst_pitch: int, rows: int, cols: int) -> None:
        """int32 dst[r, c] = src[r, c] for r < rows, c < cols (row-major, pitches in elements);
        src / dst: CuPy arrays or device addresses (ints), e.g. of mapped pinned host memory."""
        n = rows * cols
        if n <= 0:
            return
        if cols > min(src_pitch, dst_pitch):
            raise ValueError(f"copy_rows: {cols} columns exceed a pitch ({src_pitch}, {dst_pitch})")
        for a, what in ((src, "src"), (dst, "dst")):
            if isinstance(a, cp.ndarray):
                _check(a, f"copy_rows {what}", dtype=np.int32)
                if a.size < (rows - 1) * (src_pitch if what == "src" else dst_pitch) + cols:
                    raise ValueError(f"copy_rows: {what} of {a.size} elements is too small")
        self.f_copy_rows((min(64, -(-n // 256)),), (256,), (_addr(src), _i32(src_pitch), _addr(dst), _i32(dst_pitch),
                                                            _i32(rows), _i32(cols)))

    def embedding(self, tokens: cp.ndarray, table: cp.ndarray, out: cp.ndarray, feed: cp.ndarray | None = None,
                  prev: cp.ndarray | None = None) -> None:
        """out[r] = table[token r]; with feed (int32 [rows]) and prev (int32, the previous step's
        sampled tokens), row r's token is prev[feed[r] - 1] where feed[r] > 0, else tokens[r]."""
        rows = tokens.shape[0]
        vocab, dim = table.shape
        _check(tokens, "embedding tokens", (rows,), np.int32)
        _check(table, "embedding table", dtype=self.storage)
        _check(out, "embedding out", (rows, dim), self.storage)
        if (feed is None) != (prev is None):
            raise ValueError("embedding: feed and prev go together")
        if feed is not None:
            _check(feed, "embedding feed", (rows,), np.int32)
            _check(prev, "embedding prev", dtype=np.int32)
        if rows:
            self.f_embedding((rows,), (128,), (tokens, _ptr(feed), _ptr(prev), table, out, _i32(dim), _i32(vocab)))

    def add_rmsnorm(self, residual: cp.ndarray, delta: cp.ndarray | None, weight: cp.ndarray,
                    out: cp.ndarray, eps: float, parts: cp.ndarray | None = None) -> None:
        """residual += delta (rounded, in place; skipped when delta is None); out = norm(residual).

        With `parts` (fp32 [S, rows, dim], gemm_split's slices) the delta is their in-order sum
        rounded to the storage: the split product's output, summed here instead of by a kernel
        of its own."""
        rows, dim = residual.shape
        _check(residual, "rmsnorm residual", dtype=self.storage)
        if delta is not None and parts is not None:
            raise ValueError("rmsnorm: a delta or a split product's parts, not both")
        if delta is not None:
            _check(delta, "rmsnorm delta", (rows, dim), self.storage)
        nparts = 0
        if parts is not None:
            nparts = parts.shape[0]
            _check(parts, "rmsnorm parts", (nparts, rows, dim), np.float32)
        _check(weight, "rmsnorm weight", (dim,), self.storage)
        _check(out, "rmsnorm out", (rows, dim), self.storage)
        if not rows:
            return
        kind, threads = rms_norm_kernel(dim, self.vec)
        fast = self.f_rmsnorm_fast.get((kind, nparts))
        args = (residual, _ptr(delta), _ptr(parts), weight, out, _i32(rows), _i32(dim), np.float32(eps))
        if fast is not None and _aligned16(residual, weight, out, *(a for a in (delta, parts) if a is not None)):
            if kind == "row":  # a block a row
                fast((rows,), (threads,), args)
            else:  # a warp a row; a block of one warp when the slices make each row's loads heavy
                per_block = 1 if nparts else 4
                fast((-(-rows // per_block),), (32 * per_block,), args)
        else:
            self.f_rmsnorm((rows,), (256,), (residual, _ptr(delta), _ptr(parts), _i32(nparts), weight, out,
                                             _i32(dim), np.float32(eps)), shared_mem=4 * dim)

    def _check_rope_inputs(self, qkv, bias, cos, sin, width: int, max_seq: int) -> None:
        """qkv fp32 [rows, width], bias [width] or None, cos/sin fp32 tables covering max_seq."""
        hd = self.head_dim
        _check(qkv, "rope qkv", (qkv.shape[0], width), np.float32)
        if bias is not None:
            _check(bias, "rope bias", (width,), self.storage)
        _check(cos, "rope cos", dtype=np.float32)
        _check(sin, "rope sin", cos.shape, np.float32)
        if cos.shape[0] < max_seq or cos.shape[1] != hd // 2:
            raise ValueError(f"rope tables {cos.shape} do not cover [{max_seq}, {hd // 2}]")

    def rope_qkv(self, qkv: cp.ndarray, bias: cp.ndarray | None, cos: cp.ndarray, sin: cp.ndarray,
                 positions: cp.ndarray, slots: cp.ndarray, q_out: cp.ndarray, cache: cp.ndarray,
                 num_heads: int, num_kv_heads: int) -> None:
        """cache: one layer, [slots, 2, K, max_seq, hd]."""
        hd = self.head_dim
        rows = qkv.shape[0]
        width = (num_heads + 2 * num_kv_heads) * hd
        max_seq = cache.shape[3]
        self._check_rope_inputs(qkv, bias, cos, sin, width, max_seq)
        _check(positions, "rope positions", (rows,), np.int32)
        _check(slots, "rope slots", (rows,), np.int32)
        _check(q_out, "rope q_out", (rows, num_heads * hd), self.storage)
        _check(cache, "rope cache", (cache.shape[0], 2, num_kv_heads, max_seq, hd), self.storage)
        npairs = (num_heads + 2 * num_kv_heads) * hd // 2
        block = min(1024, -(-npairs // 32) * 32)
        if rows:
            self.f_rope((rows,), (block,), (qkv, _ptr(bias), cos, sin, positions, slots, q_out, cache,
                                            _i32(num_heads), _i32(num_kv_heads), _i32(hd), _i32(max_seq)))

    def swiglu(self, gate_up: cp.ndarray, out: cp.ndarray) -> None:
        rows, two_f = gate_up.shape
        _check(gate_up, "swiglu gate_up", dtype=self.storage)
        _check(out, "swiglu out", (rows, two_f // 2), self.storage)
        n = rows * (two_f // 2)
        if not n:
            return
        if (two_f // 2) % self.vec == 0 and _aligned16(gate_up, out):
            grid = min(-(-(n // self.vec) // 256), 132 * 16)
            self.f_swiglu_vec((grid,), (256,), (gate_up, out, _i32(rows), _i32(two_f // 2)))
        else:
            grid = min(-(-n // 256), 132 * 16)
            self.f_swiglu((grid,), (256,), (gate_up, out, _i32(rows), _i32(two_f // 2)))

    # ---------------------------------------------------------------- attention

    def attention_decode(self, q: cp.ndarray, cache: cp.ndarray, slots: cp.ndarray, seq_lens: cp.ndarray,
                         part_acc: cp.ndarray, part_ml: cp.ndarray, out: cp.ndarray) -> None:
        """One query row per sequence; part_acc [rows, K, nsplit, G, hd], part_ml [rows, K, nsplit, G, 2]."""
        hd, g = self.head_dim, self.group
        rows = q.shape[0]
        _check(q, "attention q", (rows, cache.shape[2] * g * hd), self.storage)
        num_kv_heads, max_seq, split_len, nsplit = self._check_decode_buffers(cache, slots, seq_lens, part_acc,
                                                                              part_ml, out)
        if not rows:
            return
        if self.f_decode_mma is not None and _aligned16(q, cache):
            self._decode_mma(q, cache, slots, seq_lens, part_acc, part_ml, out, None)
            return
        scale = np.float32(1.0 / math.sqrt(hd))
        self.f_decode_partial((nsplit, num_kv_heads, rows), (DECODE_TILE,),
                              (q, cache, slots, seq_lens, part_acc, part_ml, _i32(num_kv_heads),
                               _i32(max_seq), _i32(split_len), _i32(nsplit), scale))
        self.f_decode_combine((rows, num_kv_heads * g), (hd,),
                              (part_acc, part_ml, seq_lens, out, _i32(num_kv_heads), _i32(split_len),
                               _i32(nsplit)))

    def _check_decode_buffers(self, cache, slots, seq_lens, part_acc, part_ml, out) -> tuple[int, int, int, int]:
        """The decode attention's cache, row indices, split scratch and output for out's rows;
        returns (num_kv_heads, max_seq, split_len, nsplit), the scratch's splits."""
        hd, g = self.head_dim, self.group
        rows = out.shape[0]
        num_kv_heads, max_seq = cache.shape[2], cache.shape[3]
        split_len, nsplit = decode_split(max_seq)
        _check(cache, "attention cache", (cache.shape[0], 2, num_kv_heads, max_seq, hd), self.storage)
        _check(slots, "attention slots", (rows,), np.int32)
        _check(seq_lens, "attention seq_lens", (rows,), np.int32)
        _check(part_acc, "attention part_acc", (rows, num_kv_heads, nsplit, g, hd), np.float32)
        _check(part_ml, "attention part_ml", (rows, num_kv_heads, nsplit, g, 2), np.float32)
        _check(out, "attention out", (rows, num_kv_heads * g * hd), self.storage)
        return num_kv_heads, max_seq, split_len, nsplit

    @property
    def fused_rope_decode(self) -> bool:
        """Whether attention_decode_rope is available (the tensor-core kernel's shapes)."""
        return self.f_decode_mma is not None

    def attention_decode_rope(self, qkv: cp.ndarray, bias: cp.ndarray | None, cos: cp.ndarray, sin: cp.ndarray,
                              cache: cp.ndarray, slots: cp.ndarray, seq_lens: cp.ndarray, part_acc: cp.ndarray,
                              part_ml: cp.ndarray, out: cp.ndarray) -> None:
        """rope_qkv then attention_decode in one kernel, for decode rows (the new token of row r
        at position seq_lens[r] - 1): the cache gets that position's k and v, as rope_qkv writes
        them, and out the attention; no q buffer."""
        if not self.fused_rope_decode:
            raise ValueError(f"cuda ops: no fused RoPE decode for {self.dtype}, head_dim {self.head_dim}, "
                             f"group {self.group}")
        num_kv_heads, max_seq, _, _ = self._check_decode_buffers(cache, slots, seq_lens, part_acc, part_ml, out)
        if qkv.shape[0] != out.shape[0]:
            raise ValueError(f"attention qkv: {qkv.shape[0]} rows, out has {out.shape[0]}")
        self._check_rope_inputs(qkv, bias, cos, sin, num_kv_heads * (self.group + 2) * self.head_dim, max_seq)
        if not _aligned16(cache):
            raise ValueError("attention cache: must start on a 16-byte boundary (16-byte loads)")
        if out.shape[0]:
            self._decode_mma(None, cache, slots, seq_lens, part_acc, part_ml, out, (qkv, bias, cos, sin))

    def _decode_mma(self, q, cache, slots, seq_lens, part_acc, part_ml, out, rope) -> None:
        """attn_decode_mma (and the combine when the plan splits), on checked arguments."""
        hd, g = self.head_dim, self.group
        rows = out.shape[0]
        num_kv_heads, max_seq = cache.shape[2], cache.shape[3]
        nsplit = part_acc.shape[2]
        qkv, bias, cos, sin = rope if rope is not None else (None, None, None, None)
        warps, split_len, used = mma_decode_plan(rows, num_kv_heads, max_seq, hd, g, nsplit)
        self.f_decode_mma((used, num_kv_heads, rows), (32 * warps,),
                          (_ptr(q), cache, slots, seq_lens, part_acc, part_ml, out, _i32(num_kv_heads),
                           _i32(max_seq), _i32(split_len), _i32(used), np.float32(1.0 / math.sqrt(hd)),
                           _ptr(qkv), _ptr(bias), _ptr(cos), _ptr(sin)),
                          shared_mem=4 * warps * g * (hd + 2))
        if used > 1:  # part_* hold `used` splits a row here (their first rows * K * used * G)
            self.f_decode_combine((rows, num_kv_heads * g), (hd,),
                                  (part_acc, part_ml, seq_lens, out, _i32(num_kv_heads), _i32(split_len),
                                   _i32(used)))

    def prefill_tiles(self, seq_rows: list[tuple[int, int, int, int]]) -> tuple[np.ndarray, int]:
        """plan.prefill_tiles for this head_dim and group."""
        return prefill_tiles(seq_rows, self.head_dim, self.group)

    def attention_prefill(self, q: cp.ndarray, cache: cp.ndarray, tiles: cp.ndarray, qt: int,
                          out: cp.ndarray) -> None:
        hd, g = self.head_dim, self.group
        num_kv_heads, max_seq = cache.shape[2], cache.shape[3]
        _check(q, "prefill q", (q.shape[0], num_kv_heads * g * hd), self.storage)
        _check(cache, "prefill cache", (cache.shape[0], 2, num_kv_heads, max_seq, hd), self.storage)
        _check(tiles, "prefill tiles", (tiles.shape[0], 4), np.int32)
        _check(out, "prefill out", q.shape, self.storage)
        if not tiles.shape[0]:
            return
        ds = hd // 64 if hd > 64 else 1
        block = -(-qt * g * ds // 32) * 32
        self.f_prefill((tiles.shape[0], num_kv_heads), (block,),
                       (q, cache, tiles, out, _i32(num_kv_heads), _i32(max_seq), _i32(qt),
                        np.float32(1.0 / math.sqrt(hd))))

    # ---------------------------------------------------------------- conversion

    def convert(self, src: cp.ndarray, dst: cp.ndarray, dtype: str | None = None) -> None:
        """dst (fp16 / bf16 storage) = round-to-nearest-even(src fp32), element for element."""
        dtype = dtype or ("fp16" if dst.dtype == np.float16 else "bf16")
        _check(src, "convert src", dtype=np.float32)
        _check(dst, "convert dst", src.shape, STORAGE[dtype])
        convert(src, dst, dtype, self.f_convert[dtype])


_convert_fns: dict = {}


def convert(src: cp.ndarray, dst: cp.ndarray, dtype: str, fn=None) -> None:
    """fp32 -> fp16/bf16 RNE on the GPU (also usable without an Ops: loads convert.cu)."""
    if dtype == "fp32":
        dst[...] = src
        return
    if fn is None:
        key = (dtype, cp.cuda.runtime.getDevice())
        fn = _convert_fns.get(key)
        if fn is None:
            expr = "convert_f32<0>" if dtype == "fp16" else "convert_f32<1>"
            fn = _convert_fns[key] = loader.load("convert", loader.expressions("convert")).get_function(expr)
    n = src.size
    if n:
        grid = min(-(-n // (4 * 256)), 132 * 32)
        fn((grid,), (256,), (src, dst.view(np.uint16), np.int64(n)))
