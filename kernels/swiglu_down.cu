// The decode step's MLP down projection with SwiGLU fused, for at most 64 rows (fp16 / bf16):
//   act = round(silu(gate) * up)              (swiglu.cu's value, bit for bit)
//   out = round(act @ w^T)                    w [N, F], fp32 accumulation
// with gate_up [M, 2F] = [gate | up]. At M = 64 cuBLAS runs this product split along F with
// a separate reduction, after a separate SwiGLU kernel: three launches, ~10 us a layer for
// 8.7 MB of weights, mostly latency. Here:
// - swiglu_down_partial: a block of 8 warps takes 128 output columns and a slice of F
//   (`kc`, a multiple of 32). It first issues its whole weight slice into registers (16-byte
//   loads, all in flight at once), then computes act for the 64 rows x kc into shared
//   memory (each value once a block), then runs mma.m16n8k16 with act as A (rows) and w as
//   B: warp w owns columns [16 w, 16 w + 16) of the block, all four 16-row tiles. As in
//   attention_decode.cu, the order of the k sum inside a 32-wide chunk is free, so a lane's
//   fragments are the 8 consecutive k of its own 16-byte loads, for act and w alike. The
//   slice's fp32 sums go to part [split, 64, N].
// - swiglu_down_reduce: out = round(sum over splits, in split order): deterministic.
#include "dtype.cuh"
#include "silu.cuh"

#define SD_WARPS 8       // warps a block; 16 columns each
#define SD_COLS 128      // output columns a block
#define SD_MAX_KC 288    // largest slice of F a block takes (9 chunks of 32)
#define SD_ROWS 64       // rows at most (four 16-row tiles)

template <class D>
struct SdMma;

template <>
struct SdMma<F16> {
    static __device__ __forceinline__ void mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
};

template <>
struct SdMma<BF16> {
    static __device__ __forceinline__ void mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                               unsigned b0, unsigned b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
};

template <class D>
__global__ void __launch_bounds__(SD_WARPS * 32)
swiglu_down_partial(const typename D::T* __restrict__ gate_up, const typename D::T* __restrict__ w,
                    float* __restrict__ part, int rows, int n, int f, int kc) {
    typedef typename D::T T;
    constexpr int CHUNKS = SD_MAX_KC / 32;
    constexpr int LD = SD_MAX_KC + 8;  // act row stride (elements): 16 bytes of padding
    __shared__ __align__(16) T act[SD_ROWS * LD];
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int fn = lane >> 2, ft = lane & 3;  // fragment row ("groupID") and column pair
    const int k0 = blockIdx.y * kc;
    const int klen = min(kc, f - k0);  // a multiple of 32 (f is)
    const int chunks = klen >> 5;
    const int col0 = blockIdx.x * SD_COLS + warp * 16;

    // the weight slice first: n-tile j, chunk c: w[col0 + 8 j + fn][k0 + 32 c + 8 ft, +8)
    uint4 wr[2][CHUNKS];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int col = col0 + 8 * j + fn;
        const T* src = w + (long long)col * f + k0 + 8 * ft;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c)
            wr[j][c] = (col < n && c < chunks) ? *reinterpret_cast<const uint4*>(src + 32 * c) : zero;
    }

    // act for every row and the slice, once a block (rows past `rows` are zeros)
    const int vecs = klen >> 3;  // 8 values a vector
    for (int i = threadIdx.x; i < SD_ROWS * vecs; i += blockDim.x) {
        const int r = i / vecs, v = i - r * vecs;
        uint4 out = zero;
        if (r < rows) {
            const T* g = gate_up + (long long)r * 2 * f + k0 + 8 * v;
            float gv[8], uv[8];
            unpack16<D>(*reinterpret_cast<const uint4*>(g), gv);
            unpack16<D>(*reinterpret_cast<const uint4*>(g + f), uv);
#pragma unroll
            for (int k = 0; k < 8; ++k) gv[k] = silu_mul(gv[k], uv[k]);
            out = pack16<D>(gv);
        }
        *reinterpret_cast<uint4*>(&act[r * LD + 8 * v]) = out;
    }
    __syncthreads();

    // act (A, rows) x w^T (B): chunk c is two k-steps; lane words x, y then z, w
    float acc[4][2][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        if (c < chunks) {
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                const uint4 lo = *reinterpret_cast<const uint4*>(&act[(16 * mt + fn) * LD + 32 * c + 8 * ft]);
                const uint4 hi = *reinterpret_cast<const uint4*>(&act[(16 * mt + fn + 8) * LD + 32 * c + 8 * ft]);
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    SdMma<D>::mma(acc[mt][j], lo.x, hi.x, lo.y, hi.y, wr[j][c].x, wr[j][c].y);
                    SdMma<D>::mma(acc[mt][j], lo.z, hi.z, lo.w, hi.w, wr[j][c].z, wr[j][c].w);
                }
            }
        }
    }

    // the slice's sums: part[split][row][col]
    float* dst = part + (long long)blockIdx.y * SD_ROWS * n;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int col = col0 + 8 * j + 2 * ft;
            if (col < n) {
                const int r = 16 * mt + fn;
                *reinterpret_cast<float2*>(dst + (long long)r * n + col) = make_float2(acc[mt][j][0], acc[mt][j][1]);
                *reinterpret_cast<float2*>(dst + (long long)(r + 8) * n + col) =
                    make_float2(acc[mt][j][2], acc[mt][j][3]);
            }
        }
}

// out[r, col] = round(sum over the splits in order): one thread an output.
template <class D>
__global__ void swiglu_down_reduce(const float* __restrict__ part, typename D::T* __restrict__ out, int rows,
                                   int n, int splits) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n) return;
    const int r = i / n, col = i - r * n;
    float s = 0.f;
    for (int k = 0; k < splits; ++k) s += part[((long long)k * SD_ROWS + r) * n + col];
    out[i] = D::store(s);
}
