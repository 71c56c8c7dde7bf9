// fp32 -> engine dtype, round-to-nearest-even, bit for bit as ratchet.model.dtypes.round_to
// (and torch's .to(dtype)) give it, NaN included. For in-place weight sync: the source is a
// torch fp32 tensor seen through DLPack, the destination an engine weight buffer.
//
// convert_f32: one tensor (convert_tiles: the same, one block per tile). convert_many: every tensor of a sync in one launch, from a device
// array of descriptors (src, dst, n, first chunk); the work is cut into chunks of
// CONVERT_CHUNK elements that blocks take in a grid-stride loop, each thread 8 consecutive
// elements per step (two 16-byte loads, one 16-byte store), all its loads issued first.
// Launched plainly (no programmatic dependent launch, so no pdl_begin): griddepcontrol at the
// start of these kernels slowed the sync (docs/KERNELS.md, run 6).
#include "dtype.cuh"
#include "rounding.cuh"

#define CONVERT_CHUNK 8192  // elements per chunk: a multiple of 8, 4 steps of 256 threads

template <int BF16_OUT>
__global__ void convert_f32(const float* __restrict__ src, unsigned short* __restrict__ dst, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long nvec = n / 4;
    const bool aligned = (reinterpret_cast<size_t>(src) & 15) == 0 && (reinterpret_cast<size_t>(dst) & 7) == 0;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (aligned) {
        for (; i < nvec; i += stride) {
            const float4 f = reinterpret_cast<const float4*>(src)[i];
            ushort4 o;
            o.x = to_bits<BF16_OUT>(f.x);
            o.y = to_bits<BF16_OUT>(f.y);
            o.z = to_bits<BF16_OUT>(f.z);
            o.w = to_bits<BF16_OUT>(f.w);
            reinterpret_cast<ushort4*>(dst)[i] = o;
        }
        i = nvec * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    }
    for (; i < n; i += stride) dst[i] = to_bits<BF16_OUT>(src[i]);
}

struct ConvertDesc {      // one tensor of a sync; 32 bytes, as ratchet/engine/cuda/sync.py packs it
    long long src;        // const float*
    long long dst;        // unsigned short* (fp16 / bf16 bits) or float* (MODE 2)
    long long n;          // elements
    long long chunk0;     // index of its first chunk; descriptors sorted by it
};

__device__ __forceinline__ unsigned int pack2(unsigned short lo, unsigned short hi) {
    return (unsigned int)lo | ((unsigned int)hi << 16);
}

// convert_tiles: one range as convert_f32 converts it, cut the way torch's element-wise copy
// cuts it: one block per tile of 1,024 x LOADS elements (no grid-stride loop), each thread
// LOADS warp-coalesced float4 loads issued before its first store. convert_f32's one float4 a
// thread in flight left the H200's bandwidth idle: 1.11 ms for the 0.5B sync where torch's
// copy of the same bytes takes 0.68 (docs/KERNELS.md, sync run 7). 256 threads; src 16-byte
// and dst 8-byte aligned, else the scalar loop (as convert_f32).
template <int BF16_OUT, int LOADS>
__global__ void __launch_bounds__(256)
convert_tiles(const float* __restrict__ src, unsigned short* __restrict__ dst, long long n) {
    constexpr long long TILE = 256LL * 4 * LOADS;  // values a block converts
    const long long tile = (long long)blockIdx.x * TILE;
    const bool aligned = (reinterpret_cast<size_t>(src) & 15) == 0 && (reinterpret_cast<size_t>(dst) & 7) == 0;
    if (aligned) {
        const long long nvec = n / 4, first = tile / 4;
        float4 f[LOADS];
#pragma unroll
        for (int s = 0; s < LOADS; ++s) {
            const long long v = first + s * 256 + threadIdx.x;
            if (v < nvec) f[s] = reinterpret_cast<const float4*>(src)[v];
        }
#pragma unroll
        for (int s = 0; s < LOADS; ++s) {
            const long long v = first + s * 256 + threadIdx.x;
            if (v < nvec) {
                ushort4 o;
                o.x = to_bits<BF16_OUT>(f[s].x);
                o.y = to_bits<BF16_OUT>(f[s].y);
                o.z = to_bits<BF16_OUT>(f[s].z);
                o.w = to_bits<BF16_OUT>(f[s].w);
                reinterpret_cast<ushort4*>(dst)[v] = o;
            }
        }
        const long long i = nvec * 4 + threadIdx.x;  // the last n % 4 values, by the last tile's block
        if (i < n && tile <= nvec * 4 && nvec * 4 < tile + TILE) dst[i] = to_bits<BF16_OUT>(src[i]);
    } else {
        const long long end = min(tile + TILE, n);
        for (long long i = tile + threadIdx.x; i < end; i += 256) dst[i] = to_bits<BF16_OUT>(src[i]);
    }
}

// Elements [from, end) of one tensor, one a thread in a block-stride loop: a chunk's tail past its
// vector groups, or a whole chunk whose pointers are not 16-byte aligned.
template <int MODE>
__device__ __forceinline__ void convert_scalar(const float* __restrict__ src, long long dst_addr,
                                               long long from, long long end) {
    for (long long i = from + threadIdx.x; i < end; i += blockDim.x) {
        if (MODE == 2) reinterpret_cast<float*>(dst_addr)[i] = src[i];
        else reinterpret_cast<unsigned short*>(dst_addr)[i] = to_bits<MODE>(src[i]);
    }
}

// MODE 0: fp16, 1: bf16, 2: fp32 (a plain copy). 256 threads (other sizes take the scalar path);
// a grid of at most 4 blocks per multiprocessor keeps every block resident.
template <int MODE>
__global__ void __launch_bounds__(256, 4)
convert_many(const ConvertDesc* __restrict__ descs, int ndesc, long long nchunks) {
    constexpr int STEPS = CONVERT_CHUNK / (8 * 256);
    for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
        int lo = 0, hi = ndesc - 1;  // the last descriptor with chunk0 <= c
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (__ldg(&descs[mid].chunk0) <= c) lo = mid;
            else hi = mid - 1;
        }
        const float* src = reinterpret_cast<const float*>(__ldg(&descs[lo].src));
        const long long dst_addr = __ldg(&descs[lo].dst);
        const long long n = __ldg(&descs[lo].n);
        const long long begin = (c - __ldg(&descs[lo].chunk0)) * CONVERT_CHUNK;
        const long long end = min(begin + (long long)CONVERT_CHUNK, n);
        const bool aligned = ((reinterpret_cast<size_t>(src) | (size_t)dst_addr) & 15) == 0;
        if (aligned && blockDim.x == 256) {
            const long long full = begin + ((end - begin) & ~7LL);  // 8-element groups
            float4 a[STEPS], b[STEPS];
#pragma unroll
            for (int s = 0; s < STEPS; ++s) {
                const long long i = begin + 8LL * (s * 256 + threadIdx.x);
                if (i < full) {
                    a[s] = __ldcs(reinterpret_cast<const float4*>(src + i));
                    b[s] = __ldcs(reinterpret_cast<const float4*>(src + i + 4));
                }
            }
#pragma unroll
            for (int s = 0; s < STEPS; ++s) {
                const long long i = begin + 8LL * (s * 256 + threadIdx.x);
                if (i < full) {
                    if (MODE == 2) {
                        float* dst = reinterpret_cast<float*>(dst_addr);
                        reinterpret_cast<float4*>(dst + i)[0] = a[s];
                        reinterpret_cast<float4*>(dst + i)[1] = b[s];
                    } else {
                        unsigned short* dst = reinterpret_cast<unsigned short*>(dst_addr);
                        uint4 o;
                        o.x = pack2(to_bits<MODE>(a[s].x), to_bits<MODE>(a[s].y));
                        o.y = pack2(to_bits<MODE>(a[s].z), to_bits<MODE>(a[s].w));
                        o.z = pack2(to_bits<MODE>(b[s].x), to_bits<MODE>(b[s].y));
                        o.w = pack2(to_bits<MODE>(b[s].z), to_bits<MODE>(b[s].w));
                        *reinterpret_cast<uint4*>(dst + i) = o;
                    }
                }
            }
            convert_scalar<MODE>(src, dst_addr, full, end);
        } else {
            convert_scalar<MODE>(src, dst_addr, begin, end);
        }
    }
}

// convert_table: convert_many's work with two changes the sync bench chose (docs/KERNELS.md):
// the chunk's descriptor read from a table (one load, not a binary search of dependent loads
// before the chunk's first load can issue), and each load a warp-coalesced 16 bytes per thread
// (a warp reads 512 contiguous bytes per instruction, writes 256). CHUNK / (4 * 256) loads per
// thread, all issued before the first store. MIN_BLOCKS: resident blocks per multiprocessor
// (the register budget); STREAM: evict-first loads (__ldcs) or plain ones. Launched with one
// block per chunk or a grid-stride loop over them (the caller's grid).
template <int MODE, int CHUNK, int MIN_BLOCKS, int STREAM>
__global__ void __launch_bounds__(256, MIN_BLOCKS)
convert_table(const ConvertDesc* __restrict__ descs, const int* __restrict__ chunk_desc, long long nchunks) {
    constexpr int STEPS = CHUNK / (4 * 256);
    static_assert(STEPS * 4 * 256 == CHUNK, "CHUNK: a multiple of 1024");
    for (long long c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const int d = __ldg(&chunk_desc[c]);
        const float* src = reinterpret_cast<const float*>(__ldg(&descs[d].src));
        const long long dst_addr = __ldg(&descs[d].dst);
        const long long n = __ldg(&descs[d].n);
        const long long begin = (c - __ldg(&descs[d].chunk0)) * CHUNK;
        const long long end = min(begin + (long long)CHUNK, n);
        const bool aligned = ((reinterpret_cast<size_t>(src) | (size_t)dst_addr) & 15) == 0;
        if (aligned && blockDim.x == 256) {
            const long long full = begin + ((end - begin) & ~3LL);  // 4-element groups
            float4 a[STEPS];
#pragma unroll
            for (int s = 0; s < STEPS; ++s) {
                const long long i = begin + 4LL * (s * 256 + threadIdx.x);
                if (i < full) a[s] = STREAM ? __ldcs(reinterpret_cast<const float4*>(src + i))
                                            : *reinterpret_cast<const float4*>(src + i);
            }
#pragma unroll
            for (int s = 0; s < STEPS; ++s) {
                const long long i = begin + 4LL * (s * 256 + threadIdx.x);
                if (i < full) {
                    if (MODE == 2) {
                        reinterpret_cast<float4*>(reinterpret_cast<float*>(dst_addr) + i)[0] = a[s];
                    } else {
                        uint2 o;
                        o.x = pack2(to_bits<MODE>(a[s].x), to_bits<MODE>(a[s].y));
                        o.y = pack2(to_bits<MODE>(a[s].z), to_bits<MODE>(a[s].w));
                        *reinterpret_cast<uint2*>(reinterpret_cast<unsigned short*>(dst_addr) + i) = o;
                    }
                }
            }
            convert_scalar<MODE>(src, dst_addr, full, end);
        } else {
            convert_scalar<MODE>(src, dst_addr, begin, end);
        }
    }
}
