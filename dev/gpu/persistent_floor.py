"""The floor of a persistent decode kernel (docs/KERNELS.md, goal 7's route): one launch that
streams a step's bytes phase by phase, a grid-wide barrier between phases, and no arithmetic.
Qwen2.5-0.5B at B = 64 (fp16): per layer [qkv], [attention: the rows' K and V at a mean
context], [wo], [gate_up], [w_down], then the head. Timed with CUDA events:
- `stream`: the bytes with a barrier after every phase (the megakernel's memory floor), and
  with the next phase's first loads issued before each barrier (weights depend on nothing);
- `no barriers`: the same bytes in one sweep a phase, no barrier (bandwidth alone);
- `barriers only`: the barriers without the loads (their cost alone);
each with an atomic counter's barrier and with one of flags (a block's epoch each, no atomics);
- `ring`: each block streams its share of every phase through 8 stages of shared memory
  (cp.async) ahead of what it consumes, so the next phases' loads are in flight while it waits
  at a barrier: the floor of a kernel whose weight stream never waits on the grid.

    python -m dev.gpu.persistent_floor [--rows 64] [--context 256]
"""

from __future__ import annotations

import argparse
import json

import cupy as cp
import numpy as np

SOURCE = r"""
__device__ __forceinline__ uint4 ldg(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

// Sense-reversing grid barrier: every block of the grid resident (one a multiprocessor).
__device__ __forceinline__ void grid_barrier(unsigned* count, volatile unsigned* gen, unsigned nblocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(count, 1u) == nblocks - 1) {
            *count = 0;
            __threadfence();
            atomicAdd((unsigned*)gen, 1u);
        } else {
            while (*gen == g) {}
        }
        __threadfence();
    }
    __syncthreads();
}

// A barrier without atomics: each block publishes its epoch in its own flag (release), and
// thread t < gridDim.x of every block waits for block t's (acquire); epochs only grow.
__device__ __forceinline__ void flag_barrier(unsigned* flags, unsigned epoch) {
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + blockIdx.x), "r"(epoch) : "memory");
    if (threadIdx.x < gridDim.x) {
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(flags + threadIdx.x) : "memory");
        } while (seen < epoch);
    }
    __syncthreads();
}

// The loads decoupled from the barriers: each block streams its own contiguous share of every
// phase through a ring of RING stages of shared memory (cp.async), RING - 1 stages ahead of
// the stage it consumes, so the loads of the next phases are in flight while the block waits
// at a phase boundary (flag_barrier) before consuming them. `sync` 0: no barriers.
#define RING 8
#define SV 1024  // 16-byte vectors a stage (16 KiB), 2 a thread of 512

struct Cursor {  // a walk over this block's stages, phase by phase
    int phase = 0;
    long long base = 0, done = 0;
};

__device__ __forceinline__ void block_chunk(const long long* phases, int p, long long base, long long& lo,
                                            long long& n) {
    const long long all = phases[p];
    lo = base + all * blockIdx.x / gridDim.x;
    n = base + all * (blockIdx.x + 1) / gridDim.x - lo;
}

// The cursor's next stage: (first vector, count, phase); count 0 once every phase is done.
__device__ __forceinline__ int next_stage(Cursor& c, const long long* phases, int nphases, long long& first,
                                          int& phase) {
    while (c.phase < nphases) {
        long long lo, n;
        block_chunk(phases, c.phase, c.base, lo, n);
        if (c.done < n) {
            const int count = (int)min((long long)SV, n - c.done);
            first = lo + c.done;
            phase = c.phase;
            c.done += count;
            return count;
        }
        c.base += phases[c.phase];
        ++c.phase;
        c.done = 0;
    }
    return 0;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

extern "C" __global__ void __launch_bounds__(512, 1)
stream_ring(const uint4* __restrict__ data, const long long* __restrict__ phases, int nphases, int sync,
            unsigned* flags, unsigned epoch0, unsigned* sink) {
    extern __shared__ uint4 ring[];  // RING x SV
    Cursor prod, cons;
    unsigned acc = 0;
    int issued = 0;
    auto issue = [&]() {  // the producer's next stage into slot issued % RING (or an empty group)
        long long first;
        int phase;
        const int count = next_stage(prod, phases, nphases, first, phase);
        uint4* slot = ring + (issued % RING) * SV;
        for (int v = threadIdx.x; v < count; v += blockDim.x) cp_async16(slot + v, data + first + v);
        asm volatile("cp.async.commit_group;" ::: "memory");
        ++issued;
    };
    for (int s = 0; s < RING - 1; ++s) issue();
    int current = -1;  // the phase being consumed
    for (int k = 0;; ++k) {
        issue();  // into the slot consumed at k - 1
        long long first;
        int phase;
        const int count = next_stage(cons, phases, nphases, first, phase);
        if (count == 0) break;
        asm volatile("cp.async.wait_group %0;" ::"n"(RING - 1) : "memory");
        __syncthreads();
        if (phase != current) {  // a phase boundary: every block done with the phases before
            if (sync && current >= 0) flag_barrier(flags, epoch0 + (unsigned)phase);
            current = phase;
        }
        const uint4* slot = ring + (k % RING) * SV;
        for (int v = threadIdx.x; v < count; v += blockDim.x) acc ^= slot[v].x;
        __syncthreads();  // the slot is free for the issue of k + 1
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (acc == 0x9e3779b9u) sink[0] = acc;
}

// phases[i] = 16-byte vectors of phase i (consecutive in `data`); barrier after each if `sync`.
extern "C" __global__ void __launch_bounds__(512, 1)
stream_phases(const uint4* __restrict__ data, const long long* __restrict__ phases, int nphases, int sync,
              int load, unsigned* count, unsigned* gen, unsigned* sink, unsigned* flags, unsigned epoch0) {
    unsigned acc = 0;
    long long base = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    uint4 pre[4];
    int npre = 0;  // sync == 2: pre holds this phase's first npre loads, issued before the last barrier
    for (int p = 0; p < nphases; ++p) {
        const long long n = phases[p];
        if (load) {
            long long i = first;
            for (int j = 0; j < 4; ++j)
                if (j < npre) acc ^= pre[j].x;
            i += npre * stride;
            npre = 0;
            for (; i + 3 * stride < n; i += 4 * stride) {
                const uint4 a = ldg(data + base + i), b = ldg(data + base + i + stride);
                const uint4 c = ldg(data + base + i + 2 * stride), d = ldg(data + base + i + 3 * stride);
                acc ^= a.x ^ b.y ^ c.z ^ d.w;
            }
            for (; i < n; i += stride) acc ^= ldg(data + base + i).x;
        }
        base += n;
        if ((sync == 2 || sync == 4) && load && p + 1 < nphases) {
            // the next phase's first loads go out before the barrier: weights wait on nothing
            for (int j = 0; j < 4; ++j)
                if (first + j * stride < phases[p + 1]) {
                    pre[j] = ldg(data + base + first + j * stride);
                    npre = j + 1;
                }
        }
        if (sync >= 3)
            flag_barrier(flags, epoch0 + p + 1);
        else if (sync)
            grid_barrier(count, gen, gridDim.x);
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads
}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--context", type=int, default=256)
    args = ap.parse_args()
    layers, d, inter, q_heads, kv_heads, hd, vocab = 24, 896, 4864, 14, 2, 64, 151936
    qkv = (q_heads + 2 * kv_heads) * hd * d * 2
    kv = args.rows * args.context * 2 * kv_heads * hd * 2
    per_layer = [qkv, kv, q_heads * hd * d * 2, 2 * inter * d * 2, inter * d * 2]
    phases = per_layer * layers + [vocab * d * 2]
    vec = [-(-b // 16) for b in phases]
    total = int(sum(vec))
    data4 = cp.full(total * 4, 1, dtype=np.uint32)  # 16-byte vectors, read as uint4 by the kernel
    module = cp.RawModule(code=SOURCE, options=("-std=c++17",))  # both kernels, one compile
    fn, ring = module.get_function("stream_phases"), module.get_function("stream_ring")
    ring_smem = 8 * 1024 * 16  # RING x SV x 16 bytes
    ring.max_dynamic_shared_size_bytes = ring_smem
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    phases_d = cp.asarray(np.array(vec, dtype=np.int64))
    count, gen, sink = cp.zeros(1, np.uint32), cp.zeros(1, np.uint32), cp.zeros(1, np.uint32)
    flags, epoch = cp.zeros(sms, np.uint32), [0]  # flag barriers' epochs grow from launch to launch

    def launch(sync: int, load: int) -> None:
        fn((sms,), (512,), (data4, phases_d, np.int32(len(vec)), np.int32(sync), np.int32(load), count, gen, sink,
                            flags, np.uint32(epoch[0])))
        epoch[0] += len(vec)

    def ring_launch(sync: int) -> None:
        ring((sms,), (512,), (data4, phases_d, np.int32(len(vec)), np.int32(sync), flags, np.uint32(epoch[0]), sink),
             shared_mem=ring_smem)
        epoch[0] += len(vec)

    def timed(call, reps: int = 50) -> float:
        """Microseconds a launch of `call()`, over `reps` after 5 to warm up."""
        for _ in range(5):
            call()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(reps):
            call()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1e3 / reps

    out = {"rows": args.rows, "context": args.context, "phases": len(vec), "barriers": len(vec),
           "bytes_MB": 16 * total / 1e6, "roofline_us_at_4.2TBps": 16 * total / 4.2e12 * 1e6}
    out["stream us"] = timed(lambda: launch(1, 1))
    out["stream, next phase's first loads before each barrier, us"] = timed(lambda: launch(2, 1))
    out["stream, flag barriers, us"] = timed(lambda: launch(3, 1))
    out["stream, flag barriers and the next phase's first loads before each, us"] = timed(lambda: launch(4, 1))
    out["flag barriers only us"] = timed(lambda: launch(3, 0))
    out["no barriers us"] = timed(lambda: launch(0, 1))
    out["barriers only us"] = timed(lambda: launch(1, 0))
    out["ring, 8 stages of 16 KiB ahead, no barriers, us"] = timed(lambda: ring_launch(0))
    out["ring, 8 stages of 16 KiB ahead, a flag barrier at every phase, us"] = timed(lambda: ring_launch(1))
    out["barrier us each"] = out["barriers only us"] / len(vec)
    out["stream TB/s"] = 16 * total / (out["stream us"] * 1e-6) / 1e12
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
