"""A decode step's inputs and outputs in pinned host memory that the step's graph itself reads
and writes (kernels/staging.cu: no copy-engine copies between back-to-back steps). Two
buffer pairs alternate, so that a step is staged while the one before it runs."""

from __future__ import annotations

import cupy as cp
import numpy as np

# int32 fields of a decode step's inputs, one column a row (the graph reads them from the pinned buffer)
TOKENS, SLOTS, POSITIONS, SEQ_LENS, PARAMS = 0, 1, 2, 3, 4  # PARAMS: 5 rows (sampler.pack_params)
FEED = 9  # 1 + the previous step's row whose sampled token is this row's input; 0: TOKENS
NUM_FIELDS = 10


def mapped(host_ptr: int) -> int:
    """The device address of pinned host memory (the same address under unified addressing)."""
    try:
        return int(cp.cuda.runtime.pointerGetAttributes(host_ptr).devicePointer) or host_ptr
    except Exception:
        return host_ptr


class CudaStep:
    """A launched `decode_sample`: its tokens and logprobs land in buffer pair `buf`'s output
    when that pair's event fires."""

    def __init__(self, staging: "Staging", n: int, buf: int):
        self.staging, self.n, self.buf = staging, n, buf
        self._result: tuple[np.ndarray, np.ndarray] | None = None

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if self._result is None:
            st = self.staging
            st.done[self.buf].synchronize()
            out = st.host_out_np[self.buf]
            self._result = (out[0, :self.n].astype(np.int64), out[1, :self.n].view(np.float32).copy())
            if st.out_owner[self.buf] is self:
                st.out_owner[self.buf] = None
        return self._result


class Staging:
    """Two pinned input / output buffer pairs of `width` columns (the largest bucket), their
    device addresses, the event each pair's last step records, and the unread step each holds."""

    def __init__(self, width: int):
        self.width = width
        self.host_ints = [cp.cuda.alloc_pinned_memory(NUM_FIELDS * width * 4) for _ in range(2)]
        self.host_ints_np = [np.frombuffer(m, np.int32, NUM_FIELDS * width).reshape(NUM_FIELDS, width)
                             for m in self.host_ints]
        self.host_out = [cp.cuda.alloc_pinned_memory(2 * width * 4) for _ in range(2)]
        self.host_out_np = [np.frombuffer(m, np.int32, 2 * width).reshape(2, width) for m in self.host_out]
        self.host_ints_dev = [mapped(m.ptr) for m in self.host_ints]
        self.host_out_dev = [mapped(m.ptr) for m in self.host_out]
        self.done = [cp.cuda.Event(disable_timing=True) for _ in range(2)]  # a step's outputs written back
        self.out_owner: list[CudaStep | None] = [None, None]  # the unread step a buffer pair holds
        self.next = 0  # the buffer pair the next step stages into

    def stage(self, slots, tokens, positions, bucket: int, scratch_slot: int, feed=None) -> tuple[np.ndarray, int]:
        """One step's model inputs into the next pinned input buffer: (the buffer's first
        `bucket` columns, the buffer's index). Padding rows: token 0 at position 0 of the
        scratch slot, greedy."""
        k = self.next
        owner = self.out_owner[k]
        if owner is not None:  # the step two launches back: read its result, its graph has read the buffer
            owner.result()
        else:  # the step two launches back had no sampler (or there was none): wait until it ran
            self.done[k].synchronize()
        self.next ^= 1
        n, b = len(slots), bucket
        host = self.host_ints_np[k][:, :b]
        if n < b:
            host[:, n:] = 0
            host[SLOTS, n:], host[SEQ_LENS, n:] = scratch_slot, 1
        host[TOKENS, :n], host[SLOTS, :n], host[POSITIONS, :n] = tokens, slots, positions
        np.add(positions, 1, out=host[SEQ_LENS, :n], casting="unsafe")
        if feed is None:
            host[FEED, :n] = 0
        else:
            np.add(feed, 1, out=host[FEED, :n], casting="unsafe")
        return host, k

    def launched(self, n: int, k: int) -> CudaStep:
        """The handle of a sampling step just launched on buffer pair k; the pair holds it
        until it is read."""
        step = self.out_owner[k] = CudaStep(self, n, k)
        return step
