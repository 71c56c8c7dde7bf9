// sync_telemetry: the per-sync telemetry (ratchet/rl/telemetry.py) in one pass over a sync's
// tensors, from a descriptor table as convert_table's (src, last, n, chunk0), one block
// of 256 threads a chunk of TELEMETRY_CHUNK values. MODE 0 / 1 rounds each fp32 master to fp16 /
// bf16 as the sync does (to_bits), counts where the rounded value differs from `last` (what the
// engine held since the previous sync: the share this sync makes visible) and from the master
// (masters off the dtype's grid), both compared as values as torch's `!=` compares them, stores
// it as the new `last`, and sums its 16-bit word into ratchet/model/checksum.py's two position
// weighted sums of its tensor. MODE 3 reads 16-bit words already stored (the engine's buffers,
// any storage seen as words) and only sums them. Integer sums: the atomics' order leaves them
// exact. Torch's path made several passes over the masters and their copies (~16 ms at 0.5B).
#include "dtype.cuh"
#include "rounding.cuh"

#define TELEMETRY_CHUNK 8192
#define TELEMETRY_HELD 3
#define CHECKSUM_BLOCK_BITS 16  // ratchet.model.checksum.BLOCK: 2^16 words

struct TelemetryDesc {  // one tensor; 32 bytes, as ratchet/engine/cuda/telemetry.py packs it
    long long src;        // const float* (MODE 0 / 1) or const unsigned short* (MODE 3)
    long long last;       // unsigned short*: the values held since the last sync (MODE 0 / 1)
    long long n;          // values (16-bit words for MODE 3)
    long long chunk0;     // index of its first chunk
};

template <int MODE>
__device__ __forceinline__ float bits_value(unsigned short w) {
    return MODE == 1 ? BF16::load(w) : F16::load(w);
}

template <int MODE>
__global__ void __launch_bounds__(256)
sync_telemetry(const TelemetryDesc* __restrict__ descs, const int* __restrict__ chunk_desc, long long nchunks,
               unsigned long long* __restrict__ sums, unsigned long long* __restrict__ counts) {
    const long long c = blockIdx.x;  // one block a chunk
    if (c >= nchunks) return;
    const int d = __ldg(&chunk_desc[c]);
    const long long src_addr = __ldg(&descs[d].src), last_addr = __ldg(&descs[d].last);
    const long long n = __ldg(&descs[d].n);
    const long long begin = (c - __ldg(&descs[d].chunk0)) * TELEMETRY_CHUNK;
    const long long end = min(begin + (long long)TELEMETRY_CHUNK, n);
    long long within = 0, across = 0;
    unsigned int changed = 0, off = 0;
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        unsigned short w;
        if (MODE == TELEMETRY_HELD) {
            w = reinterpret_cast<const unsigned short*>(src_addr)[i];
        } else {
            const float m = reinterpret_cast<const float*>(src_addr)[i];
            unsigned short* last = reinterpret_cast<unsigned short*>(last_addr);
            w = to_bits<MODE>(m);
            const float v = bits_value<MODE>(w);
            changed += v != bits_value<MODE>(last[i]);
            off += v != m;
            last[i] = w;
        }
        const long long s = (short)w;
        within += s * ((i & ((1LL << CHECKSUM_BLOCK_BITS) - 1)) + 1);
        across += s * ((i >> CHECKSUM_BLOCK_BITS) + 1);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        within += __shfl_xor_sync(0xffffffffu, within, o);
        across += __shfl_xor_sync(0xffffffffu, across, o);
        changed += __shfl_xor_sync(0xffffffffu, changed, o);
        off += __shfl_xor_sync(0xffffffffu, off, o);
    }
    __shared__ long long warp_within[8], warp_across[8];
    __shared__ unsigned int warp_changed[8], warp_off[8];
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {
        warp_within[warp] = within, warp_across[warp] = across;
        warp_changed[warp] = changed, warp_off[warp] = off;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)(blockDim.x >> 5); ++k) {
            within += warp_within[k], across += warp_across[k];
            changed += warp_changed[k], off += warp_off[k];
        }
        atomicAdd(&sums[2 * d], (unsigned long long)within);  // two's complement: a signed sum
        atomicAdd(&sums[2 * d + 1], (unsigned long long)across);
        if (MODE != TELEMETRY_HELD) {
            atomicAdd(&counts[0], (unsigned long long)changed);
            atomicAdd(&counts[1], (unsigned long long)off);
        }
    }
}
