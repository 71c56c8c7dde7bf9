"""A NumPy stand-in for the CuPy the CUDA backend uses, with kernels (FakeOps, the sampler's
launch) written with the NumPy backend's own layers and storage roundings: the backend's host
side (staging, feed, graphs, buckets, packed prefill) then runs on a CPU, and must give the
NumPy engine's bits. While a stream captures, kernels are recorded into its graph, not run.
`install()` before anything imports ratchet.engine.cuda; in a process of its own."""

from __future__ import annotations

import sys
import types

import numpy as np

from ratchet.engine.numpy.layers import apply_rope, attention, linear, rms_norm, silu_mul
from ratchet.engine.sampling import SamplingBatch

CAPTURE: list = [None]  # the kernels of the graph being captured, or None: kernels run at once
PINNED: dict = {}  # pinned buffers by address: a kernel given an address reads the buffer


class FakeArray(np.ndarray):
    def get(self):
        return np.array(self)

    def set(self, x):
        self[...] = x

    class _Data:
        def __init__(self, a):
            self.ptr = a.ctypes.data

    @property
    def data(self):  # noqa
        return FakeArray._Data(np.asarray(self))


def _fa(x):
    return np.asarray(x).view(FakeArray)


cp = types.ModuleType("cupy")
cp.ndarray = FakeArray
cp.zeros = lambda *a, **k: _fa(np.zeros(*a, **k))
cp.empty = lambda *a, **k: _fa(np.zeros(*a, **k) + 7)  # not zero: reads before writes show
cp.full = lambda *a, **k: _fa(np.full(*a, **k))
cp.asarray = lambda x, dtype=None: x if isinstance(x, FakeArray) and dtype is None else _fa(np.array(x, dtype=dtype))
cp.ascontiguousarray = lambda x: _fa(np.ascontiguousarray(x))
cp.asnumpy = lambda x: np.array(x)
cp.from_dlpack = lambda x: _fa(np.from_dlpack(x))
cp.all = np.all
cp.uint16, cp.uint32, cp.float32 = np.uint16, np.uint32, np.float32


class Graph:
    def __init__(self, ops):
        self.ops = ops

    def launch(self, stream):
        for f in self.ops:
            f()


class Stream:
    ptr = 1

    def __init__(self, non_blocking=False, priority=None):
        self.priority = priority

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def synchronize(self):
        pass

    def begin_capture(self):
        CAPTURE[0] = []

    def end_capture(self):
        g, CAPTURE[0] = Graph(CAPTURE[0]), None
        return g


class Event:
    def __init__(self, disable_timing=False):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class Pinned(bytearray):
    pass


def alloc_pinned_memory(n):
    m = Pinned(n)
    m.ptr = np.frombuffer(m, np.uint8).ctypes.data
    PINNED[m.ptr] = m
    return m


class Device:
    def __init__(self, i=0):
        self.id = i
        self.compute_capability = "90"

    def use(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _unmapped(ptr):
    raise RuntimeError("no unified addressing here: the backend uses the host address itself")


cuda = types.ModuleType("cupy.cuda")
cuda.Stream, cuda.Event, cuda.Device, cuda.alloc_pinned_memory = Stream, Event, Device, alloc_pinned_memory
cuda.runtime = types.SimpleNamespace(getDevice=lambda: 0, deviceSynchronize=lambda: None,
                                     pointerGetAttributes=_unmapped,
                                     deviceGetStreamPriorityRange=lambda: (0, -5))  # (least, greatest)
cuda.get_current_stream = lambda: Stream()
cp.cuda = cuda


def recorded(fn):
    """A kernel: run now, or recorded into the graph while a stream captures."""
    def wrapper(*a, **k):
        if CAPTURE[0] is not None:
            CAPTURE[0].append(lambda: fn(*a, **k))
        else:
            fn(*a, **k)
    return wrapper


def _flat(a):
    if isinstance(a, (int, np.integer)):
        return np.frombuffer(PINNED[int(a)], np.int32)
    return np.asarray(a).reshape(-1)


class FakeOps:
    fused = True  # attention_decode_rope available (the tensor-core kernel's shapes)

    def __init__(self, dtype, head_dim, group):
        self.dtype, self.head_dim, self.group = dtype, head_dim, group
        self.storage = np.dtype({"fp32": np.float32, "fp16": np.float16}[dtype])

    @property
    def fused_rope_decode(self):
        return FakeOps.fused

    @recorded
    def copy_rows(self, src, src_pitch, dst, dst_pitch, rows, cols):
        s, d = _flat(src), _flat(dst)
        for r in range(rows):
            d[r * dst_pitch:r * dst_pitch + cols] = s[r * src_pitch:r * src_pitch + cols]

    @recorded
    def embedding(self, tokens, table, out, feed=None, prev=None):
        t = np.asarray(tokens)
        if feed is not None:
            f = np.asarray(feed)
            t = np.where(f > 0, np.asarray(prev)[np.maximum(f - 1, 0)], t)
        out[...] = np.asarray(table)[t]

    @recorded
    def add_rmsnorm(self, residual, delta, weight, out, eps, parts=None):
        if delta is not None:
            residual[...] = (np.asarray(residual, np.float32) + np.asarray(delta, np.float32)).astype(self.storage)
        if parts is not None:
            total = np.zeros(parts.shape[1:], np.float32)
            for p in np.asarray(parts):
                total = total + p
            residual[...] = (np.asarray(residual, np.float32) + total.astype(self.storage)).astype(self.storage)
        out[...] = rms_norm(np.asarray(residual, np.float32), np.asarray(weight), eps)

    @recorded
    def gemm(self, x, w, out):
        out[...] = linear(np.asarray(x), np.asarray(w))

    @recorded
    def gemm_split(self, x, w, parts):
        s = parts.shape[0]
        k = x.shape[1] // s
        for i in range(s):
            parts[i] = linear(np.asarray(x)[:, i * k:(i + 1) * k], np.asarray(w)[:, i * k:(i + 1) * k])

    @recorded
    def swiglu(self, gu, act):
        g, u = np.split(np.asarray(gu, np.float32), 2, axis=-1)
        act[...] = silu_mul(g, u)

    def _rope_rows(self, qkv, bias, cos, sin, positions, slots, cache, num_heads, num_kv_heads):
        hd = self.head_dim
        v = np.asarray(qkv, np.float32)
        if bias is not None:
            v = v + np.asarray(bias, np.float32)
        v = v.astype(self.storage).astype(np.float32)
        rows = v.shape[0]
        q, k, val = np.split(v, [num_heads * hd, (num_heads + num_kv_heads) * hd], -1)
        c, s = np.asarray(cos)[positions], np.asarray(sin)[positions]
        q = apply_rope(q.reshape(rows, num_heads, hd), c, s).astype(self.storage)
        k = apply_rope(k.reshape(rows, num_kv_heads, hd), c, s).astype(self.storage)
        for r in range(rows):
            cache[slots[r], 0, :, positions[r]] = k[r]
            cache[slots[r], 1, :, positions[r]] = val[r].reshape(num_kv_heads, hd)
        return q

    @recorded
    def rope_qkv(self, qkv, bias, cos, sin, positions, slots, q_out, cache, num_heads, num_kv_heads):
        q = self._rope_rows(qkv, bias, cos, sin, np.asarray(positions), np.asarray(slots), cache, num_heads,
                            num_kv_heads)
        q_out[...] = q.reshape(q.shape[0], -1)

    def _attend(self, q, cache, slots, last_pos, out):
        rows = q.shape[0]
        H = q.shape[1] // self.head_dim
        for r in range(rows):
            keys = np.asarray(cache)[slots[r], 0][None]
            vals = np.asarray(cache)[slots[r], 1][None]
            a = attention(np.asarray(q[r:r + 1], np.float32).reshape(1, H, self.head_dim), keys, vals,
                          np.array([last_pos[r]]))
            out[r] = a.reshape(-1)

    @recorded
    def attention_decode(self, q, cache, slots, seq_lens, part_acc, part_ml, out):
        self._attend(np.asarray(q), cache, np.asarray(slots), np.asarray(seq_lens) - 1, out)

    @recorded
    def attention_decode_rope(self, qkv, bias, cos, sin, cache, slots, seq_lens, part_acc, part_ml, out):
        K = cache.shape[2]
        H = K * self.group
        pos = np.asarray(seq_lens) - 1
        q = self._rope_rows(qkv, bias, cos, sin, pos, np.asarray(slots), cache, H, K)
        self._attend(q.reshape(q.shape[0], -1), cache, np.asarray(slots), pos, out)

    def prefill_tiles(self, seq_rows):
        from ratchet.engine.cuda.plan import prefill_tiles  # the real plan: only the kernels are faked

        return prefill_tiles(seq_rows, self.head_dim, self.group)

    @recorded
    def attention_prefill(self, q, cache, tiles, qt, out):
        for row0, n, slot, pos0 in np.asarray(tiles):
            for i in range(n):
                self._attend(np.asarray(q)[row0 + i:row0 + i + 1], cache, [slot], [pos0 + i],
                             out[row0 + i:row0 + i + 1])


@recorded
def fake_sampler_launch(logits, params, tokens_out, logprobs_out, table=None, work=None):
    from ratchet.engine import sampler as np_sampler

    rows = logits.shape[0]
    p = np.asarray(params)[:, :rows]
    t = p[3].view(np.float32)
    greedy = (p[4] & 1).astype(bool) | ~(t > 0)  # padding rows: T = 0
    forced = (p[4] >> 1) - 1
    keys = p[:3].view(np.uint32).astype(np.int64)
    batch = SamplingBatch(keys[0], keys[1], keys[2], t, greedy, forced)
    tok, lp = np_sampler.sample(np.asarray(logits), batch)
    tokens_out[:rows] = tok
    logprobs_out[:rows] = lp


def _host(address: int, ctype, n: int) -> np.ndarray:
    """The n values at a host address (a pointer a descriptor carries), as an array over them."""
    return np.ctypeslib.as_array((ctype * max(n, 1)).from_address(address))[:n]


def fake_telemetry_kernel(mode: int):
    """kernels/telemetry.cu's sync_telemetry<mode> in NumPy, reading and writing the memory its
    descriptors point at: the same chunk walk, rounding (ratchet.model.dtypes), counts and sums."""
    import ctypes

    from ratchet.engine.cuda.plan import TELEMETRY_CHUNK
    from ratchet.model.dtypes import bf16_bits_to_fp32, fp32_to_bf16_bits

    def launch(grid, block, args):
        desc, table, nchunks, out, counts = args
        desc, table = np.asarray(desc), np.asarray(table)
        for c in range(int(nchunks)):
            d = int(table[c])
            src, last, n, first = (int(x) for x in desc[d])
            begin = (c - first) * TELEMETRY_CHUNK
            i = np.arange(begin, min(begin + TELEMETRY_CHUNK, n), dtype=np.int64)
            if mode == 3:
                words = _host(src, ctypes.c_uint16, n)[i]
            else:
                m, held = _host(src, ctypes.c_float, n)[i], _host(last, ctypes.c_uint16, n)
                if mode == 0:
                    words = m.astype(np.float16).view(np.uint16)
                    value, before = (w.view(np.float16).astype(np.float32) for w in (words, held[i]))
                else:
                    words = fp32_to_bf16_bits(m)
                    value, before = bf16_bits_to_fp32(words), bf16_bits_to_fp32(held[i])
                counts[0] += np.uint64((value != before).sum())
                counts[1] += np.uint64((value != m).sum())
                held[i] = words
            w = words.view(np.int16).astype(np.int64)
            for k, weight in enumerate(((i & 0xFFFF) + 1, (i >> 16) + 1)):
                out[2 * d + k] = np.uint64((int(out[2 * d + k]) + int((w * weight).sum())) % (1 << 64))
    return launch


def install():
    """The fake CuPy in sys.modules, and the backend's kernels replaced by the fakes."""
    sys.modules["cupy"] = cp
    sys.modules["cupy.cuda"] = cuda
    import ratchet.engine.cuda.backend as be
    from ratchet.engine.cuda import sampler as gs
    be.Ops = FakeOps
    gs.launch = fake_sampler_launch
    gs.gumbel_table = lambda: None
    gs.workspace = lambda rows: np.zeros(rows)
    from ratchet.engine.cuda import telemetry
    telemetry._kernel = fake_telemetry_kernel
