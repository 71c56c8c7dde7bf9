"""The CUDA backend, tying together staging.py (pinned step buffers), graphs.py (captured
steps), forward.py (the layer loop) and prefill.py: the NumPy backend's numbers up to fp32
summation order, deterministic run to run, and batch-invariant on request (one decode
bucket, prompts prefilled by decode steps), the mode teacher forcing relies on."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Sequence

import cupy as cp
import numpy as np

from ratchet.engine.backend import ReadyStep, fed_tokens, feed_rows
from ratchet.engine.cuda import sampler as gpu_sampler
from ratchet.engine.cuda import sync, telemetry
from ratchet.engine.cuda.forward import LayerLoop, Workspace
from ratchet.engine.cuda.graphs import DecodeGraphs, buckets_for
from ratchet.engine.cuda.ops import STORAGE, Ops, decode_split
from ratchet.engine.cuda.prefill import (
    PREFILL_CHUNK,
    prefill_by_decode,
    prefill_passes,
    run_packed_pass,
)
from ratchet.engine.cuda.staging import PARAMS, CudaStep, Staging
from ratchet.engine.sampling import SamplingBatch
from ratchet.errors import InputError
from ratchet.model.config import ModelConfig
from ratchet.model.dtypes import fp16_values, fp32_to_bf16_bits
from ratchet.model.flat_weights import FlatWeights
from ratchet.model.layout import (
    DTYPES,
    check_update,
    check_weights,
    flat_offsets,
    flat_views,
    rope_tables,
)


def engine_stream():
    """The engine's stream, at the device's highest priority unless RATCHET_STREAM_PRIORITY=0:
    when a trainer shares the GPU (split on one GPU, the engine on a thread of its process),
    the decode step's many small kernels are scheduled ahead of the trainer's queued blocks,
    and generation is that loop's longer phase. Alone on the GPU it changes nothing, and
    never a bit: the same kernels run in the same order on this stream."""
    if os.environ.get("RATCHET_STREAM_PRIORITY", "1") == "0":
        return cp.cuda.Stream(non_blocking=True)
    priority_range = getattr(cp.cuda.runtime, "deviceGetStreamPriorityRange", None)
    greatest = priority_range()[1] if priority_range else -(2 ** 16)  # CUDA clamps it to the greatest
    try:
        return cp.cuda.Stream(non_blocking=True, priority=greatest)
    except TypeError:  # a CuPy without stream priorities: scheduling as before, nothing else
        print("[engine] this CuPy's Stream takes no priority: the engine's stream keeps the default one")
        return cp.cuda.Stream(non_blocking=True)


class CudaBackend:
    """KV cache [layers, slots + 1, 2, kv_heads, max_seq, head_dim] (the extra slot takes a
    bucket's padding rows); weights in one buffer a tensor, written in place by every update,
    so captured graphs stay valid and a weight sync allocates nothing."""

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
        self.prefill_chunk = prefill_chunk
        self.batch_invariant = batch_invariant
        self.device_id = cp.cuda.Device().id
        self.weight_device = f"cuda:{self.device_id}"  # update_weights takes DLPack tensors there
        self.storage = np.dtype(STORAGE[dtype])
        self.ops = Ops(dtype, hd, group)
        self.stream = engine_stream()
        self.scratch_slot = max_batch_size
        with self.stream:
            self.kv = cp.zeros((cfg.num_layers, max_batch_size + 1, 2, cfg.num_kv_heads, max_seq_len, hd),
                               dtype=self.storage)
            cos, sin = rope_tables(cfg, max_seq_len)
            self.rope_cos, self.rope_sin = cp.asarray(cos), cp.asarray(sin)
            self.buckets = buckets_for(max_batch_size)[-1:] if batch_invariant else buckets_for(max_batch_size)
            self.split_len, self.nsplit = decode_split(max_seq_len)
            self.dec = Workspace(cfg, self.storage, self.buckets[-1], self.buckets[-1], self.nsplit)
            self.gumbel = gpu_sampler.gumbel_table()
        self.stream.synchronize()
        self.kv_layers = [self.kv[i] for i in range(cfg.num_layers)]
        self.layers = LayerLoop(cfg, self.ops, self.kv_layers, self.rope_cos, self.rope_sin)
        self.staging = Staging(self.buckets[-1])
        self._last_sample: CudaStep | None = None  # the last sampling step: what `feed` reads
        # decode products run split along K where plan.split_k says so (small buckets); () for none
        self.split_products: tuple[str, ...] = ("wo", "w_down")
        self.weights: dict[str, cp.ndarray] = {}
        self.weight_sync: sync.WeightSync | None = None  # the buffers' pointers, once they exist
        self._checksum_launch = telemetry.Launch()  # weight_checksums' descriptors, kept
        self.flat_weights: cp.ndarray | None = None  # every buffer's storage, in flat_offsets' layout
        self.flat_sync: sync.WeightSync | None = None  # the whole of it as one buffer (FlatWeights)
        self._graphs = DecodeGraphs(self.stream, self._decode_body, enabled=use_graphs)
        self.lengths = np.zeros(max_batch_size, dtype=np.int64)

    @property
    def use_graphs(self) -> bool:
        """Decode steps replay captured graphs (off after a failed capture, or when set off)."""
        return self._graphs.enabled

    @use_graphs.setter
    def use_graphs(self, value: bool) -> None:
        self._graphs.enabled = value

    @property
    def graph_error(self) -> str | None:
        return self._graphs.error

    # ---------------------------------------------------------------- weights

    def load_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        check_weights(self.cfg, weights, "cuda backend load_weights")
        if not self.weights:
            _, length = flat_offsets(self.cfg)  # the trainer's CUDA masters' layout
            with self.stream:
                self.flat_weights = cp.empty(length, dtype=self.storage)
                self.weights = flat_views(self.cfg, self.flat_weights)
            self.layers.bind(self.weights)
        self.update_weights(weights)

    def update_weights(self, weights: Mapping) -> None:
        """Any subset of the tensors: NumPy float32 arrays (on the dtype grid) or torch fp32
        CUDA tensors (rounded on the GPU through DLPack); written into the existing buffers."""
        if not self.weights:
            raise RuntimeError("cuda backend update_weights: load_weights first")
        if isinstance(weights, FlatWeights) and sync.is_device_tensor(weights.flat):
            self._copy_flat(weights)
        else:
            self._copy_mapping(weights)
        self.stream.synchronize()
        self.reset()

    def _copy_flat(self, weights: FlatWeights) -> None:
        """Every tensor at once from the one buffer behind them: one check of one tensor and
        one launch into the engine's own flat buffer (the same layout), where a mapping costs
        a check per tensor the GPU waits for."""
        if weights.cfg != self.cfg:
            raise InputError("cuda backend update_weights: FlatWeights of another model configuration")
        if self.flat_sync is None:
            self.flat_sync = sync.WeightSync({"flat": self.flat_weights}, self.dtype)
        with self.stream:
            self.flat_sync.copy([("flat", weights.flat)])

    def _copy_mapping(self, weights: Mapping) -> None:
        check_update(self.cfg, weights, "cuda backend update_weights")
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

    def weight_checksums(self) -> dict[str, tuple[int, int]]:
        """ratchet.model.checksum's checksums of the weight buffers, one launch (telemetry.py)."""
        with self.stream:
            out = dict(zip(self.weights, telemetry.buffer_checksums(list(self.weights.values()), self._checksum_launch)))
        return out

    def _host_storage(self, value) -> np.ndarray:
        value = np.asarray(value, dtype=np.float32)
        if self.dtype == "fp16":
            return fp16_values(value)  # round to nearest even, as round_to does
        if self.dtype == "bf16":
            return fp32_to_bf16_bits(value)
        return np.ascontiguousarray(value)

    # ---------------------------------------------------------------- cache

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0

    def reset(self) -> None:
        self.lengths[:] = 0
        self._last_sample = None

    # ---------------------------------------------------------------- decode

    def _decode_body(self, b: int, sample: bool, k: int) -> None:
        """Bucket b's step on host buffer pair k: what a graph captures."""
        st = self.staging
        self.layers.decode_body(self.dec, b, sample, st.host_ints_dev[k], st.host_out_dev[k], st.width,
                                self.split_products, self.gumbel)

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
        """(bucket, the staged pinned input columns, the buffer pair's index) of one step."""
        b = self._bucket(len(slots))
        host, k = self.staging.stage(slots, tokens, positions, b, self.scratch_slot, feed)
        return b, host, k

    def _run_decode(self, b: int, sample: bool, k: int) -> None:
        """Bucket b's step on buffer pair k's staged inputs; the pair's event fires after it
        (with the sampler, its tokens and log-probabilities are then in the pinned output)."""
        with self.stream:
            self._graphs.run(b, sample, k)
            self.staging.done[k].record(self.stream)

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
        if feed is not None and self.use_graphs and (self._bucket(n), True, self.staging.next) not in self._graphs:
            # a bucket's first step runs its body once eagerly before the capture, and that run's
            # sampler overwrites the tokens the graph would read: take them from the host instead
            tokens = fed_tokens(feed, tokens, prev.result()[0])
            feed = None
        b, host, k = self._stage_decode(slots, tokens, positions, feed)
        gpu_sampler.pack_params(batch, out=host[PARAMS:PARAMS + 5, :n])
        self._run_decode(b, True, k)
        self.lengths[slots] = positions + 1
        step = self._last_sample = self.staging.launched(n, k)
        return step

    def replay_decode(self, rows: int) -> bool:
        """The decode step (with the sampler) of the bucket that holds `rows`, run again on
        buffer pair 0's staged inputs, neither staged nor waited for: a step's GPU time alone
        (benchmarks). True when it ran as a captured graph."""
        with self.stream:
            return self._graphs.run(self._bucket(rows), True, 0)

    def _bucket(self, n: int) -> int:
        return next(x for x in self.buckets if x >= n)

    # ---------------------------------------------------------------- prefill

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
        """Prefill several sequences: float32 logits [n, V] of each last row (NumPy; CuPy on
        the GPU with device=True)."""
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
            prefill_by_decode(seqs, logits, self._checked_decode_logits, self.stream)
        else:
            for pieces in prefill_passes(seqs, self.prefill_chunk):
                run_packed_pass(self.layers, self.stream, pieces, logits)
        for slot, ids, start in seqs:
            self.lengths[slot] = start + len(ids)
        if device:
            return logits
        with self.stream:
            return logits.get()

    def _checked_decode_logits(self, slots, tokens, positions) -> cp.ndarray:
        return self._decode_logits(*self._check_decode(slots, tokens, positions))
