"""The CUDA backend: the model forward on one GPU, through CuPy, cuBLAS and kernels/*.cu.

Same numbers as the NumPy backend (ratchet/engine/numpy/backend.py) up to fp32 summation
order: weights and KV cache in the engine dtype (fp16 by default, bf16, fp32), products with
fp32 accumulation (cuBLAS gemmEx, no TF32), activations stored in the engine dtype at the
same points (embedding, residual after each add, norm outputs, qkv after bias and q/k after
RoPE, attention output, wo / gate_up / SwiGLU / w_down outputs), logits fp32.

- Weights live in one buffer per engine tensor; `update_weights` writes into them in place
  (NumPy arrays from the host, or torch CUDA tensors through DLPack, rounded on the GPU), so
  the captured graphs stay valid and a weight sync allocates nothing.
- KV cache [layers, slots + 1, 2, kv_heads, max_seq, head_dim]; the extra slot takes the
  padding rows of a decode bucket.
- Decode: CUDA graphs per batch bucket (1, 2, 4, ..., the next power of two >= max batch)
  over static buffers, one per pinned host buffer pair; a step's graph reads its inputs from
  the pinned buffer and writes its tokens back (kernels/staging.cu).
  `decode_sample` (what the engine calls) captures the sampler (kernels/sampler.cu) in the
  same graph, so only tokens and logprobs cross to the host; `decode` returns the logits
  (NumPy, or CuPy with device=True) and `sample` draws from logits on the GPU.
- Overlap: `decode_sample_async` launches a step and returns at once; with `feed`, a row's
  input token is read on the GPU from the previous step's sampled tokens (the embedding
  kernel), so the host can stage and launch step t + 1 before step t's tokens come back,
  and the host's ~0.1 ms a step is hidden behind the GPU's. Two pinned input / output
  buffer pairs alternate between consecutive steps.
- Prefill: any number of sequences packed into one pass (`prefill_batch`), up to
  `prefill_chunk` rows a pass; the LM head runs only on each sequence's last row.

Rows of a decode step go through cuBLAS products of the bucket's size, so a row's last bits
can depend on the bucket (the NumPy backend is batch-invariant; this one is run-to-run
deterministic). With `batch_invariant=True` it is batch-invariant too: one decode bucket
(the largest), so every product, attention plan and split-K choice has the same shape
whatever rows a step holds, and prompts are prefilled by decode steps (the same kernels as
the answer's tokens), so a row's bits depend on its own tokens only. Its prefill then costs a
decode step per prompt token; the ablations use it to score answers with the engine's own
arithmetic (ratchet/engine/score.py). (On an H200 the default mode replayed 40 rollouts bit
for bit too, cuBLAS's kernels for these shapes being row-invariant across buckets
(tests/test_cuda_engine.py); nothing promises that for other shapes, GPUs or versions.)
"""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Sequence

import cupy as cp
import numpy as np

from ratchet.engine.backend import ReadyStep, fed_tokens, feed_rows
from ratchet.engine.cuda import sampler as gpu_sampler
from ratchet.engine.cuda import sync
from ratchet.engine.cuda.ops import STORAGE, Ops, decode_split
from ratchet.engine.cuda.plan import SPLIT_K, SPLIT_K_MAX_ROWS, split_k
from ratchet.engine.sampling import SamplingBatch
from ratchet.model.config import ModelConfig
from ratchet.model.dtypes import fp32_to_bf16_bits
from ratchet.model.layout import DTYPES, check_update, check_weights, expected_shapes, rope_tables

PREFILL_CHUNK = 4096  # rows per prefill pass: bounds the activation buffers
# int32 fields of a decode step's inputs (the graph reads them from the pinned buffer)
TOKENS, SLOTS, POSITIONS, SEQ_LENS, PARAMS = 0, 1, 2, 3, 4  # PARAMS: 5 rows (sampler.pack_params)
FEED = 9  # 1 + the previous step's row whose sampled token is this row's input; 0: TOKENS
NUM_FIELDS = 10


def buckets_for(max_batch_size: int) -> list[int]:
    out = [1]
    while out[-1] < max_batch_size:
        out.append(out[-1] * 2)
    return out


class _Workspace:
    """Activation buffers for up to `rows` rows (views of the first b rows are contiguous)."""

    def __init__(self, cfg: ModelConfig, storage, rows: int, head_rows: int, nsplit: int = 0):
        d, hd = cfg.hidden_size, cfg.head_dim
        group = cfg.num_heads // cfg.num_kv_heads
        self.ints = cp.zeros((NUM_FIELDS, rows), dtype=np.int32)
        self.x = cp.empty((rows, d), dtype=storage)  # residual stream
        self.h = cp.empty((rows, d), dtype=storage)  # norm output
        self.qkv = cp.empty((rows, cfg.qkv_size), dtype=np.float32)
        self.q = cp.empty((rows, cfg.num_heads * hd), dtype=storage)
        self.att = cp.empty((rows, cfg.num_heads * hd), dtype=storage)
        self.proj = cp.empty((rows, d), dtype=storage)  # wo and w_down outputs
        self.gu = cp.empty((rows, 2 * cfg.intermediate_size), dtype=storage)
        self.act = cp.empty((rows, cfg.intermediate_size), dtype=storage)
        self.logits = cp.empty((head_rows, cfg.vocab_size), dtype=np.float32)
        if nsplit:
            self.part_acc = cp.empty((rows, cfg.num_kv_heads, nsplit, group, hd), dtype=np.float32)
            self.part_ml = cp.empty((rows, cfg.num_kv_heads, nsplit, group, 2), dtype=np.float32)
            self.sample_work = gpu_sampler.workspace(rows)
            # split-K slices of wo / w_down (flat: a bucket's [S, b, d] view is contiguous)
            self.parts = cp.empty(SPLIT_K * min(rows, SPLIT_K_MAX_ROWS) * d, dtype=np.float32)
        self.out = cp.zeros((2, rows), dtype=np.int32)  # sampled tokens, logprobs (float32 bits)


def _mapped(host_ptr: int) -> int:
    """The device address of pinned host memory (the same address under unified addressing)."""
    try:
        return int(cp.cuda.runtime.pointerGetAttributes(host_ptr).devicePointer) or host_ptr
    except Exception:
        return host_ptr


class _CudaStep:
    """A launched `decode_sample`: its tokens and logprobs land in the pinned buffer `buf`
    when its event fires."""

    def __init__(self, backend: "CudaBackend", n: int, buf: int):
        self.backend, self.n, self.buf = backend, n, buf
        self._result: tuple[np.ndarray, np.ndarray] | None = None

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if self._result is None:
            be = self.backend
            be._done[self.buf].synchronize()
            out = be.host_out_np[self.buf]
            self._result = (out[0, :self.n].astype(np.int64), out[1, :self.n].view(np.float32).copy())
            if be._out_owner[self.buf] is self:
                be._out_owner[self.buf] = None
        return self._result


class CudaBackend:
    def __init__(self, cfg: ModelConfig, dtype: str = "fp16", max_batch_size: int = 64,
                 max_seq_len: int = 4096, use_graphs: bool = True, prefill_chunk: int = PREFILL_CHUNK,
                 batch_invariant: bool = False, device: int | None = None):
        if device is not None:
            cp.cuda.Device(device).use()  # every buffer, stream and graph below lives on it
        if dtype not in DTYPES:
            raise ValueError(f"cuda backend: dtype {dtype!r} is not one of {DTYPES}")
        hd, group = cfg.head_dim, cfg.num_heads // cfg.num_kv_heads
        if hd % 8 or hd > 128 or (hd > 64 and hd % 64):
            raise ValueError(f"cuda backend: head_dim {hd} unsupported (multiples of 8 up to 64, or 128)")
        self.cfg, self.dtype = cfg, dtype
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.use_graphs, self.prefill_chunk = use_graphs, prefill_chunk
        self.batch_invariant = batch_invariant
        self.device_id = cp.cuda.Device().id
        self.weight_device = f"cuda:{self.device_id}"  # update_weights takes DLPack tensors there
        self.storage = np.dtype(STORAGE[dtype])
        self.ops = Ops(dtype, hd, group)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.scratch_slot = max_batch_size
        with self.stream:
            self.kv = cp.zeros((cfg.num_layers, max_batch_size + 1, 2, cfg.num_kv_heads, max_seq_len, hd),
                               dtype=self.storage)
            cos, sin = rope_tables(cfg, max_seq_len)
            self.rope_cos, self.rope_sin = cp.asarray(cos), cp.asarray(sin)
            self.buckets = buckets_for(max_batch_size)[-1:] if batch_invariant else buckets_for(max_batch_size)
            self.split_len, self.nsplit = decode_split(max_seq_len)
            self.dec = _Workspace(cfg, self.storage, self.buckets[-1], self.buckets[-1], self.nsplit)
            self.gumbel = gpu_sampler.gumbel_table()
        self.stream.synchronize()
        self.kv_layers = [self.kv[i] for i in range(cfg.num_layers)]
        # pinned host twins of dec.ints and dec.out, read and written by the step's graph itself
        # (kernels/staging.cu: no copy-engine copies between back-to-back steps); two of each,
        # so that a step can be staged while the one before it runs
        width = self.width = self.buckets[-1]
        self.host_ints = [cp.cuda.alloc_pinned_memory(NUM_FIELDS * width * 4) for _ in range(2)]
        self.host_ints_np = [np.frombuffer(m, np.int32, NUM_FIELDS * width).reshape(NUM_FIELDS, width)
                             for m in self.host_ints]
        self.host_out = [cp.cuda.alloc_pinned_memory(2 * width * 4) for _ in range(2)]
        self.host_out_np = [np.frombuffer(m, np.int32, 2 * width).reshape(2, width) for m in self.host_out]
        self.host_ints_dev = [_mapped(m.ptr) for m in self.host_ints]
        self.host_out_dev = [_mapped(m.ptr) for m in self.host_out]
        self._done = [cp.cuda.Event(disable_timing=True) for _ in range(2)]  # a step's outputs written back
        self._out_owner: list[_CudaStep | None] = [None, None]  # the unread step a buffer pair holds
        self._buf = 0  # the buffer pair the next step stages into
        self._last_sample: _CudaStep | None = None  # the last sampling step: what `feed` reads
        # decode products run split along K where plan.split_k says so (small buckets); () for none
        self.split_products: tuple[str, ...] = ("wo", "w_down")
        self.weights: dict[str, cp.ndarray] = {}
        self.weight_sync: sync.WeightSync | None = None  # the buffers' pointers, once they exist
        self.graphs: dict[tuple[int, bool, int], object] = {}  # (bucket, sampler, buffer pair)
        self.graph_error: str | None = None
        self.lengths = np.zeros(max_batch_size, dtype=np.int64)

    # ---------------------------------------------------------------- weights

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        check_weights(self.cfg, weights, "cuda backend load_weights")
        if not self.weights:
            with self.stream:
                self.weights = {name: cp.empty(shape, dtype=self.storage)
                                for name, shape in expected_shapes(self.cfg).items()}
            self._bind_layers()
        self.update_weights(weights)

    def update_weights(self, weights: Mapping) -> None:
        """Any subset of the tensors: NumPy float32 arrays (on the dtype grid) or torch fp32
        CUDA tensors (rounded on the GPU through DLPack); written into the existing buffers."""
        check_update(self.cfg, weights, "cuda backend update_weights")
        if not self.weights:
            raise RuntimeError("cuda backend update_weights: load_weights first")
        with self.stream:
            on_device, on_host = [], []  # GPU tensors: one launch; host arrays: cast, upload
            for item in weights.items():
                (on_device if sync.is_device_tensor(item[1]) else on_host).append(item)
            if on_host:  # cast on a few threads (NumPy's casts release the GIL)
                with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
                    for (name, _), stored in zip(on_host, pool.map(self._host_storage, (v for _, v in on_host))):
                        self.weights[name].set(stored)
            if on_device:
                if self.weight_sync is None:
                    self.weight_sync = sync.WeightSync(self.weights, self.dtype)
                self.weight_sync.copy(on_device)
        self.stream.synchronize()
        self.reset()

    def _host_storage(self, value) -> np.ndarray:
        value = np.asarray(value, dtype=np.float32)
        if self.dtype == "fp16":
            return value.astype(np.float16)  # round to nearest even, as round_to does
        if self.dtype == "bf16":
            return fp32_to_bf16_bits(value)
        return np.ascontiguousarray(value)

    def _bind_layers(self) -> None:
        w, cfg = self.weights, self.cfg
        self.layer_weights = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            nxt = w[f"layers.{i + 1}.attn_norm.weight"] if i + 1 < cfg.num_layers else w["norm.weight"]
            self.layer_weights.append((w[p + "wqkv.weight"], w.get(p + "wqkv.bias"), w[p + "wo.weight"],
                                       w[p + "mlp_norm.weight"], w[p + "w_gate_up.weight"],
                                       w[p + "w_down.weight"], nxt))
        self.head = w.get("lm_head.weight", w["embed.weight"])

    # ---------------------------------------------------------------- cache

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0

    def reset(self) -> None:
        self.lengths[:] = 0
        self._last_sample = None

    # ---------------------------------------------------------------- forward

    def _forward(self, ws: _Workspace, rows: int, attention, split: tuple[str, ...] = (),
                 feed: bool = False) -> None:
        """Rows' hidden states through every layer; leaves the final norm's output in ws.h.
        split: of "wo", "w_down", those run as split-K products (plan.split_k) whose slices
        the next add_rmsnorm sums (decode buckets). feed: rows may take their token from the
        previous step's sampled tokens (ws.out[0]; decode)."""
        o, eps, cfg = self.ops, self.cfg.rms_norm_eps, self.cfg
        tokens = ws.ints[TOKENS, :rows]
        x, h, qkv, att = ws.x[:rows], ws.h[:rows], ws.qkv[:rows], ws.att[:rows]
        proj, gu, act = ws.proj[:rows], ws.gu[:rows], ws.act[:rows]

        def project_add_norm(name, inp, w, norm_weight):  # x += inp @ w^T (rounded); h = norm(x)
            s = split_k(rows, inp.shape[1]) if name in split else 0
            if s:
                parts = ws.parts[:s * rows * cfg.hidden_size].reshape(s, rows, cfg.hidden_size)
                o.gemm_split(inp, w, parts)
                o.add_rmsnorm(x, None, norm_weight, h, eps, parts=parts)
            else:
                o.gemm(inp, w, proj)
                o.add_rmsnorm(x, proj, norm_weight, h, eps)

        o.embedding(tokens, self.weights["embed.weight"], x,
                    *((ws.ints[FEED, :rows], ws.out[0]) if feed else ()))
        o.add_rmsnorm(x, None, self.weights["layers.0.attn_norm.weight"], h, eps)
        for layer, (wqkv, bias, wo, mlp_norm, w_gate_up, w_down, next_norm) in enumerate(self.layer_weights):
            o.gemm(h, wqkv, qkv)
            attention(layer, qkv, bias, att)  # RoPE (k, v into the cache) and attention
            project_add_norm("wo", att, wo, mlp_norm)
            o.gemm(h, w_gate_up, gu)
            o.swiglu(gu, act)
            project_add_norm("w_down", act, w_down, next_norm)

    def _rope(self, ws: _Workspace, rows: int, layer: int, qkv: cp.ndarray, bias) -> cp.ndarray:
        """rope_qkv: the rows' queries (returned) and this layer's new k, v into the cache."""
        q = ws.q[:rows]
        self.ops.rope_qkv(qkv, bias, self.rope_cos, self.rope_sin, ws.ints[POSITIONS, :rows], ws.ints[SLOTS, :rows],
                          q, self.kv_layers[layer], self.cfg.num_heads, self.cfg.num_kv_heads)
        return q

    def _decode_body(self, b: int, sample: bool, k: int) -> None:
        """Bucket b's step on host buffer pair k: inputs in, the model, (the sampler, outputs out)."""
        ws = self.dec
        self.ops.copy_rows(self.host_ints_dev[k], self.width, ws.ints, self.width, NUM_FIELDS, b)
        slots, seq_lens = ws.ints[SLOTS, :b], ws.ints[SEQ_LENS, :b]
        part_acc, part_ml = ws.part_acc[:b], ws.part_ml[:b]

        def attention(layer, qkv, bias, att):
            cache = self.kv_layers[layer]
            if self.ops.fused_rope_decode:  # one kernel: RoPE, the cache write and the attention
                self.ops.attention_decode_rope(qkv, bias, self.rope_cos, self.rope_sin, cache, slots, seq_lens,
                                               part_acc, part_ml, att)
            else:
                self.ops.attention_decode(self._rope(ws, b, layer, qkv, bias), cache, slots, seq_lens, part_acc,
                                          part_ml, att)

        self._forward(ws, b, attention, split=self.split_products, feed=True)
        self.ops.gemm(ws.h[:b], self.head, ws.logits[:b])
        if sample:  # every row of the bucket: padding rows draw harmless greedy tokens
            gpu_sampler.launch(ws.logits[:b], ws.ints[PARAMS:PARAMS + 5], ws.out[0], ws.out[1].view(np.float32),
                               self.gumbel, ws.sample_work)
            self.ops.copy_rows(ws.out, self.width, self.host_out_dev[k], self.width, 2, b)

    def _graph(self, b: int, sample: bool, k: int):
        """The captured decode step of bucket b (with or without the sampler) on host buffer
        pair k, or None when capture is unavailable (then steps run eagerly, same kernels,
        same results)."""
        key = (b, sample, k)
        graph = self.graphs.get(key)
        if graph is None and self.use_graphs:
            with self.stream:
                self._decode_body(b, sample, k)  # warm-up outside the capture: cuBLAS picks its kernels
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    self._decode_body(b, sample, k)
                except Exception as e:
                    try:
                        self.stream.end_capture()
                    except Exception:
                        pass
                    self.use_graphs = False
                    self.graph_error = f"{type(e).__name__}: {e}"
                    warnings.warn(f"cuda backend: CUDA graph capture failed ({self.graph_error}); "
                                  "decoding without graphs", RuntimeWarning)
                    return None
                graph = self.stream.end_capture()
            self.graphs[key] = graph
        return graph

    def _check_decode(self, slots, tokens, positions):
        """int64 arrays (slots, tokens, positions), checked. Few NumPy calls: this runs on the
        host before every step, and the step waits for it."""
        slots, tokens, positions = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (slots, tokens, positions))
        if not len(slots) == len(tokens) == len(positions):
            raise ValueError("decode: slots, tokens and positions differ in length")
        if not len(slots):
            return slots, tokens, positions
        assert 0 <= slots.min() and slots.max() < self.max_batch_size, "decode slot out of range"
        assert 0 <= tokens.min() and tokens.max() < self.cfg.vocab_size, "decode token outside the vocabulary"
        assert np.bincount(slots, minlength=self.max_batch_size).max() == 1, "decode slots must be distinct"
        assert 0 <= positions.min() and positions.max() < self.max_seq_len, "decode position outside the cache"
        assert not (positions > self.lengths[slots]).any(), "decode position past the cache"
        return slots, tokens, positions

    def _stage_decode(self, slots, tokens, positions, feed=None) -> tuple[int, np.ndarray, int]:
        """One step's model inputs into a pinned input buffer: (bucket, the buffer's first
        bucket columns, the buffer's index). Padding rows: token 0 at position 0 of the scratch
        slot, greedy."""
        k = self._buf
        owner = self._out_owner[k]
        if owner is not None:  # the step two launches back: read its result, its graph has read the buffer
            owner.result()
        else:  # the step two launches back had no sampler (or there was none): wait until it ran
            self._done[k].synchronize()
        self._buf ^= 1
        n = len(slots)
        b = self._bucket(n)
        host = self.host_ints_np[k][:, :b]
        if n < b:
            host[:, n:] = 0
            host[SLOTS, n:], host[SEQ_LENS, n:] = self.scratch_slot, 1
        host[TOKENS, :n], host[SLOTS, :n], host[POSITIONS, :n] = tokens, slots, positions
        np.add(positions, 1, out=host[SEQ_LENS, :n], casting="unsafe")
        if feed is None:
            host[FEED, :n] = 0
        else:
            np.add(feed, 1, out=host[FEED, :n], casting="unsafe")
        return b, host, k

    def _run_decode(self, b: int, sample: bool, k: int) -> None:
        """Bucket b's step on buffer pair k's staged inputs (its graph, or eagerly); event
        _done[k] fires after it (with the sampler, the tokens and log-probabilities are then
        in host_out[k])."""
        with self.stream:
            graph = self._graph(b, sample, k) if self.use_graphs else None
            if graph is not None:
                graph.launch(self.stream)
            else:
                self._decode_body(b, sample, k)
            self._done[k].record(self.stream)

    def decode(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int],
               device: bool = False):
        """float32 logits [B, V]: NumPy (the protocol), or with device=True a CuPy copy on the GPU."""
        slots, tokens, positions = self._check_decode(slots, tokens, positions)
        if not len(slots):
            empty = np.zeros((0, self.cfg.vocab_size), dtype=np.float32)
            return cp.asarray(empty) if device else empty
        logits = self._decode_logits(slots, tokens, positions)
        with self.stream:
            return logits.copy() if device else logits.get()

    def _decode_logits(self, slots: np.ndarray, tokens: np.ndarray, positions: np.ndarray) -> cp.ndarray:
        """One decode step without the sampler on checked inputs: the rows' logits, a view of
        the workspace that the next step overwrites (read it on self.stream before then)."""
        b, _, k = self._stage_decode(slots, tokens, positions)
        self._run_decode(b, False, k)
        self.lengths[slots] = positions + 1
        return self.dec.logits[:len(slots)]

    def sample(self, logits, batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray]:
        """ratchet.engine.sampler.sample on the GPU: (tokens int64 [B], logprobs float32 [B]) as
        NumPy arrays, the tokens bit for bit the NumPy sampler's for the same logits."""
        with self.stream:
            logits = cp.asarray(logits, dtype=np.float32)
            if logits.ndim != 2 or logits.shape[1] != self.cfg.vocab_size:
                raise ValueError(f"sample: logits of shape {logits.shape}, expected [B, {self.cfg.vocab_size}]")
            n = logits.shape[0]
            batch.check(n, self.cfg.vocab_size)
            if not n:
                return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
            logits = cp.ascontiguousarray(logits)
            params = cp.asarray(gpu_sampler.pack_params(batch))
            out = cp.empty((2, n), dtype=np.int32)
            gpu_sampler.launch(logits, params, out[0], out[1].view(np.float32), self.gumbel)
            host = out.get()
        return host[0].astype(np.int64), host[1].view(np.float32).copy()

    def decode_sample(self, slots, tokens, positions, batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray]:
        """One decode step and the sampler on the GPU: (tokens int64 [B], logprobs float32 [B]),
        the NumPy sampler's tokens for these logits bit for bit."""
        return self.decode_sample_async(slots, tokens, positions, batch).result()

    def decode_sample_async(self, slots, tokens, positions, batch: SamplingBatch, feed=None):
        """`decode_sample` launched: returns a step whose `result()` waits for it. With `feed`,
        rows take their input token from the previous sampling step's rows on the GPU."""
        prev = self._last_sample
        feed, tokens = feed_rows(feed, tokens, 0 if prev is None else prev.n)
        slots, tokens, positions = self._check_decode(slots, tokens, positions)
        n = len(slots)
        batch.check(n, self.cfg.vocab_size)
        if not n:
            return ReadyStep(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
        if feed is not None and self.use_graphs and (self._bucket(n), True, self._buf) not in self.graphs:
            # a bucket's first step runs its body once eagerly before the capture, and that run's
            # sampler overwrites the tokens the graph would read: take them from the host instead
            tokens = fed_tokens(feed, tokens, prev.result()[0])
            feed = None
        b, host, k = self._stage_decode(slots, tokens, positions, feed)
        gpu_sampler.pack_params(batch, out=host[PARAMS:PARAMS + 5, :n])
        self._run_decode(b, True, k)
        self.lengths[slots] = positions + 1
        step = self._out_owner[k] = self._last_sample = _CudaStep(self, n, k)
        return step

    def replay_decode(self, rows: int) -> bool:
        """The decode step (with the sampler) of the bucket that holds `rows`, run again on
        buffer pair 0's staged inputs, neither staged nor waited for: a step's GPU time alone
        (benchmarks). True when it ran as a captured graph."""
        b = self._bucket(rows)
        graph = self._graph(b, True, 0)
        if graph is not None:
            graph.launch(self.stream)
        else:
            with self.stream:
                self._decode_body(b, True, 0)
        return graph is not None

    def _bucket(self, n: int) -> int:
        return next(x for x in self.buckets if x >= n)

    def prefill_sample(self, slots, token_lists, batch: SamplingBatch) -> tuple[np.ndarray, np.ndarray]:
        """Prefill from position 0 and sample each sequence's next token where its logits
        are: only tokens and log-probabilities cross to the host."""
        logits = self.prefill_batch(slots, token_lists, device=True)
        return self.sample(logits, batch)

    def prefill(self, slot: int, token_ids: Sequence[int], start_pos: int = 0, device: bool = False):
        """float32 logits [V] of the last position (NumPy; CuPy with device=True)."""
        return self.prefill_batch([slot], [token_ids], [start_pos], device=device)[0]

    def prefill_batch(self, slots: Sequence[int], token_lists: Sequence[Sequence[int]],
                      start_positions: Sequence[int] | None = None, device: bool = False):
        """Prefill several sequences in packed passes: float32 logits [n, V] of each last row
        (NumPy; CuPy on the GPU with device=True)."""
        if start_positions is None:
            start_positions = [0] * len(slots)
        seqs = []
        for slot, ids, start in zip(slots, token_lists, start_positions):
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            cached = int(self.lengths[slot])
            assert len(ids) > 0, "prefill needs at least one token"
            assert 0 <= slot < self.max_batch_size, f"prefill slot {slot} out of range"
            assert 0 <= start <= cached, f"prefill of slot {slot} at {start}: only {cached} cached"
            assert start + len(ids) <= self.max_seq_len, "prefill runs past max_seq_len"
            assert np.all((ids >= 0) & (ids < self.cfg.vocab_size)), "prefill token outside the vocabulary"
            seqs.append((int(slot), ids, int(start)))
        assert len({s for s, _, _ in seqs}) == len(seqs), "prefill slots must be distinct"
        with self.stream:
            logits = cp.empty((len(seqs), self.cfg.vocab_size), dtype=np.float32)
        if self.batch_invariant:
            self._prefill_by_decode(seqs, logits)
        else:
            for chunk in self._prefill_passes(seqs):
                self._prefill_pass(chunk, logits)
        for slot, ids, start in seqs:
            self.lengths[slot] = start + len(ids)
        if device:
            return logits
        with self.stream:
            return logits.get()

    def _prefill_by_decode(self, seqs, logits_out: cp.ndarray) -> None:
        """The batch-invariant prefill: token j of every sequence still that long in one decode
        step of the (single) bucket, so a prompt's cache and last logits are computed by the
        decode kernels, as the answer's tokens are."""
        longest = max(len(ids) for _, ids, _ in seqs)
        for j in range(longest):
            rows = [i for i, (_, ids, _) in enumerate(seqs) if j < len(ids)]
            logits = self._decode_logits(*self._check_decode([seqs[i][0] for i in rows], [seqs[i][1][j] for i in rows],
                                                             [seqs[i][2] + j for i in rows]))
            last = [r for r, i in enumerate(rows) if j == len(seqs[i][1]) - 1]
            if last:
                with self.stream:
                    where = cp.asarray(np.asarray([rows[r] for r in last], dtype=np.int64))
                    logits_out[where] = logits[cp.asarray(np.asarray(last, dtype=np.int64))]

    def _prefill_passes(self, seqs):
        """Pieces (sequence index, slot, ids, start, is_last) grouped into passes of <= chunk rows."""
        passes, cur, rows = [], [], 0
        for i, (slot, ids, start) in enumerate(seqs):
            off = 0
            while off < len(ids):
                take = min(len(ids) - off, self.prefill_chunk - rows)
                cur.append((i, slot, ids[off:off + take], start + off, off + take == len(ids)))
                rows, off = rows + take, off + take
                if rows == self.prefill_chunk:
                    passes.append(cur)
                    cur, rows = [], 0
        if cur:
            passes.append(cur)
        return passes

    def _prefill_pass(self, pieces, logits_out: cp.ndarray) -> None:
        rows = sum(len(p[2]) for p in pieces)
        ints = np.zeros((NUM_FIELDS, rows), dtype=np.int32)
        seq_rows, last_rows, last_seq = [], [], []
        r = 0
        for i, slot, ids, start, is_last in pieces:
            n = len(ids)
            ints[TOKENS, r:r + n] = ids
            ints[SLOTS, r:r + n] = slot
            ints[POSITIONS, r:r + n] = np.arange(start, start + n)
            seq_rows.append((r, n, slot, start))
            if is_last:
                last_rows.append(r + n - 1)
                last_seq.append(i)
            r += n
        tiles, qt = self.ops.prefill_tiles(seq_rows)
        with self.stream:
            ws = _Workspace(self.cfg, self.storage, rows, max(1, len(last_rows)))
            ws.ints.set(ints)
            tiles_gpu = cp.asarray(tiles)

            def attention(layer, qkv, bias, att):
                q = self._rope(ws, rows, layer, qkv, bias)
                self.ops.attention_prefill(q, self.kv_layers[layer], tiles_gpu, qt, att)

            self._forward(ws, rows, attention)
            if last_rows:
                h_last = cp.ascontiguousarray(ws.h[cp.asarray(np.asarray(last_rows, dtype=np.int64))])
                self.ops.gemm(h_last, self.head, ws.logits[:len(last_rows)])
                logits_out[cp.asarray(np.asarray(last_seq, dtype=np.int64))] = ws.logits[:len(last_rows)]
            self.stream.synchronize()
