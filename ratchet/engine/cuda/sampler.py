"""The sampler on the GPU (kernels/sampler.cu): one launch, each row cut into a fixed number
of blocks, giving the NumPy sampler's tokens bit for bit. The Gumbel noise of a near-winning
position is read from a table of the reference's own `gumbel_noise` over every uniform the
RNG can draw, so the GPU's float32 log never decides a token; logprobs agree to fp32 rounding."""

from __future__ import annotations

import cupy as cp
import numpy as np

from ratchet.engine.cuda import loader
from ratchet.engine.cuda.launch import pdl_kernel
from ratchet.engine.rng import UNIFORM_BITS, bits_to_uniform
from ratchet.engine.sampler import gumbel_noise
from ratchet.engine.sampling import SamplingBatch

BLOCK = 256  # kernels/sampler.cu SAMPLE_BLOCK
NCHUNKS = 8  # blocks per row; at most 32 (one warp merges them)
PARTIAL_DOUBLES = 3  # sizeof(struct Partial) == 24 bytes
assert UNIFORM_BITS == 23, "kernels/sampler.cu builds u from 23 bits"
_tables: dict[int, cp.ndarray] = {}
_kernels: dict = {}


def gumbel_table() -> cp.ndarray:
    """float32 [2**UNIFORM_BITS] on the current device: -log(-log(u_m)) as the reference computes it."""
    device = cp.cuda.runtime.getDevice()
    table = _tables.get(device)
    if table is None:
        top = np.arange(2 ** UNIFORM_BITS, dtype=np.uint32) << np.uint32(32 - UNIFORM_BITS)
        host = gumbel_noise(bits_to_uniform(top)).astype(np.float32)
        table = cp.asarray(host)
        _tables[device] = table
    return table


def _kernel(name: str):
    key = (name, cp.cuda.runtime.getDevice())
    fn = _kernels.get(key)
    if fn is None:
        fn = _kernels[key] = pdl_kernel(loader.load("sampler").get_function(name))
    return fn


WORK_DOUBLES = NCHUNKS * PARTIAL_DOUBLES + 1  # a row's partials and its counter's slot


def workspace(rows: int) -> cp.ndarray:
    """Scratch for up to `rows` rows: `rows` int32 counters first (zero; each launch leaves
    them at zero), then the per-chunk partial results. The layout depends on the capacity
    only, not on how many rows a launch samples: a counter never lands on another launch's
    partials."""
    return cp.zeros(rows * WORK_DOUBLES, dtype=np.float64)


def approx_noise_error(table: cp.ndarray | None = None) -> float:
    """max |approximate - tabulated| Gumbel noise over every uniform (the margin assumes < 2e-5)."""
    table = gumbel_table() if table is None else table
    out = cp.zeros(1, dtype=np.uint32)
    _kernel("gumbel_error")((1024,), (256,), (table, np.int32(table.size), out))
    return float(cp.asnumpy(out).view(np.float32)[0])


def pack_params(batch: SamplingBatch, out: np.ndarray | None = None) -> np.ndarray:
    """int32 [5, B]: key0 (seed), key1 (request id), counter (token index), T (float32 bits),
    greedy | (1 + forced token) << 1 (0 where the row draws). Written into `out` (any int32
    [5, B] view, e.g. a pinned upload buffer's rows) when given."""
    b = len(batch)
    params = np.empty((5, b), dtype=np.int32) if out is None else out
    keys = np.stack((batch.seeds, batch.request_ids, batch.token_indices))  # int64 [3, B]
    params[:3] = (keys & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    params[3] = batch.temperatures.view(np.int32)
    params[4] = batch.greedy
    if batch.forced is not None:
        params[4] |= ((batch.forced + 1) << 1).astype(np.int32)
    return params


def launch(logits: cp.ndarray, params: cp.ndarray, tokens_out: cp.ndarray, logprobs_out: cp.ndarray,
           table: cp.ndarray | None = None, work: cp.ndarray | None = None) -> None:
    """Sample rows of `logits` [B, V] fp32 (rows may be strided) with `params` int32 [5, >=B]:
    one launch (kernels/sampler.cu `sample`)."""
    rows, vocab = logits.shape
    if logits.dtype != np.float32 or logits.strides[1] != 4:
        raise ValueError("sampler: logits must be float32 with contiguous rows")
    if params.dtype != np.int32 or params.shape[0] != 5 or params.shape[1] < rows or not params.flags.c_contiguous:
        raise ValueError(f"sampler: params must be int32 [5, >= {rows}], contiguous")
    if tokens_out.dtype != np.int32 or logprobs_out.dtype != np.float32 or tokens_out.shape[0] < rows \
            or logprobs_out.shape[0] < rows:
        raise ValueError("sampler: outputs must be int32 and float32 of at least B rows")
    if rows == 0:
        return
    if table is None:
        table = gumbel_table()
    if work is None:
        work = workspace(rows)
    capacity = work.size // WORK_DOUBLES
    if work.dtype != np.float64 or capacity < rows:
        raise ValueError("sampler: workspace too small (see sampler.workspace)")
    ptr = work.data.ptr  # counters int32 [capacity], then the partials
    _kernel("sample")((rows, NCHUNKS), (BLOCK,), (
        logits, np.int64(logits.strides[0] // 4), np.int32(vocab), np.int32(-(-vocab // NCHUNKS)),
        params, np.int32(params.shape[1]), table, np.uint64(ptr + 8 * capacity), np.uint64(ptr), tokens_out,
        logprobs_out))


def sample(logits: cp.ndarray, batch: SamplingBatch) -> tuple[cp.ndarray, cp.ndarray]:
    """(tokens int32 [B], logprobs float32 [B]) on the GPU for `logits` [B, V] on the GPU."""
    rows = logits.shape[0]
    batch.check(rows, logits.shape[1])
    params = cp.asarray(pack_params(batch))
    tokens = cp.empty(rows, dtype=np.int32)
    logprobs = cp.empty(rows, dtype=np.float32)
    launch(logits, params, tokens, logprobs)
    return tokens, logprobs
