// The products of a decode bucket's few rows (M <= 64) that read a norm's output, on the
// tensor cores: qkv (fp32 out) and gate_up with SwiGLU in its epilogue (a tile's gate and up
// columns in one block, the activation written at once: no gate_up buffer, no swiglu launch).
//
// At M <= 64 cuBLAS's products are a few microseconds of latency each (docs/KERNELS.md,
// fourteenth session). Here a block a multiprocessor streams its share of the weights:
// - its first tile's weights are loaded before griddepcontrol.wait: nothing in the stream
//   writes weights (the sync runs between steps), so they arrive while the norm drains;
// - the rows x [M, K] go to shared memory once a block, each warp copying its own slice of K;
// - a tile (8 output columns: NT8 n8 tiles of weight rows) is split along K over the W warps,
//   each holding its CW chunks of 32 in registers (16-byte loads), the next tile's loads
//   issued before the current tile's products;
// - the warps' partial sums meet in shared memory and are added in warp order.
// Each output is its row's dot product in one fixed order whatever M, the grid or the tiles
// a block takes: deterministic and batch-invariant (mma rows are independent).
//
// K order: in a chunk of 32 values lane quad t holds values 8t..8t+7 of both operands (one
// 16-byte load each); the chunk's first mma takes words 0-1, the second words 2-3. That is a
// permutation of the mma's own k order, the same for both operands: the same dot product.
#include "dtype.cuh"
#include "tensor_core.cuh"

#define SG_EPI_F32 0     // out fp32 [rows, N]: w holds N rows (qkv)
#define SG_EPI_SWIGLU 1  // w = [gate (F) | up (F)] rows; out storage [rows, F] = swiglu.cu's value

// A 16-byte load of weights that are read once a step: not kept in L1.
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// Tile `tile`'s weights of this warp's K slice: v[c][n] = row g of n8 tile n, values 8t..8t+7
// of the warp's chunk c.
template <class D, int W, int CW, int NT8, int EPI>
__device__ __forceinline__ void load_tile(uint4 (&v)[CW][NT8], const typename D::T* __restrict__ w, int tile,
                                          int inter) {
    constexpr int K = 32 * CW * W;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int n = 0; n < NT8; ++n) {
        const int row = (EPI == SG_EPI_SWIGLU ? n * inter + 8 * tile : 8 * (NT8 * tile + n)) + (lane >> 2);
        const typename D::T* p = w + (long long)row * K + 32 * CW * warp + 8 * (lane & 3);
#pragma unroll
        for (int c = 0; c < CW; ++c) v[c][n] = ldg_stream(p + 32 * c);
    }
}

// Row r's 16-byte unit u of a warp's slice in shared memory: rows of 4 CW units; for even CW
// (a row a multiple of 128 bytes) odd rows are rotated by 4 units, so the two rows a
// quarter-warp reads fall on different banks.
template <int CW>
__device__ __forceinline__ int unit_at(int r, int u) {
    constexpr int U = 4 * CW;
    return r * U + ((CW % 2 == 0 && (r & 1)) ? (u + 4) % U : u);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

// out = x @ w^T for x [rows, K] (rows <= 64, K = 32 CW W), in `tiles` tiles of 8 columns.
// Dynamic shared memory: 16 MT rows x K values of x, then W x 4 x NT8 x 32 float4 partials.
template <class D, int W, int CW, int NT8, int EPI>
__global__ void __launch_bounds__(W * 32, 1)
small_gemm(const typename D::T* __restrict__ x, const typename D::T* __restrict__ w, void* __restrict__ out,
           int rows, int n_out, int tiles) {
    const int first = (int)((long long)blockIdx.x * tiles / gridDim.x);
    const int last = (int)((long long)(blockIdx.x + 1) * tiles / gridDim.x);
    uint4 cur[CW][NT8];
    if (first < last) load_tile<D, W, CW, NT8, EPI>(cur, w, first, n_out);
    pdl_begin();
    typedef TensorCore<D> TC;
    constexpr int K = 32 * CW * W, U = 4 * CW;
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mt_count = (rows + 15) >> 4, rows16 = 16 * mt_count;
    uint4* xs = reinterpret_cast<uint4*>(smem) + warp * rows16 * U;  // this warp's K slice
    float4* red = reinterpret_cast<float4*>(smem + (size_t)rows16 * K * sizeof(typename D::T));
    for (int i = lane; i < rows16 * U; i += 32) {
        const int r = i / U, u = i - r * U;
        if (r < rows)
            cp_async16(xs + unit_at<CW>(r, u), x + (long long)r * K + 32 * CW * warp + 8 * u);
        else
            xs[unit_at<CW>(r, u)] = make_uint4(0u, 0u, 0u, 0u);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory");
    __syncwarp();

    for (int tile = first; tile < last;) {
        const bool more = tile + 1 < last;
        uint4 next[CW][NT8];
        if (more) load_tile<D, W, CW, NT8, EPI>(next, w, tile + 1, n_out);
        float acc[4][NT8][4];
#pragma unroll
        for (int m = 0; m < 4; ++m)
#pragma unroll
            for (int n = 0; n < NT8; ++n)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[m][n][j] = 0.f;
#pragma unroll
        for (int c = 0; c < CW; ++c) {
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                if (m < mt_count) {
                    const uint4 a0 = xs[unit_at<CW>(16 * m + g, 4 * c + t)];
                    const uint4 a1 = xs[unit_at<CW>(16 * m + g + 8, 4 * c + t)];
                    const unsigned lo[4] = {a0.x, a1.x, a0.y, a1.y}, hi[4] = {a0.z, a1.z, a0.w, a1.w};
#pragma unroll
                    for (int n = 0; n < NT8; ++n) {
                        TC::mma(acc[m][n], lo, cur[c][n].x, cur[c][n].y);
                        TC::mma(acc[m][n], hi, cur[c][n].z, cur[c][n].w);
                    }
                }
            }
        }
#pragma unroll
        for (int m = 0; m < 4; ++m)
            if (m < mt_count)
#pragma unroll
                for (int n = 0; n < NT8; ++n)
                    red[((warp * 4 + m) * NT8 + n) * 32 + lane] =
                        make_float4(acc[m][n][0], acc[m][n][1], acc[m][n][2], acc[m][n][3]);
        __syncthreads();
        for (int item = threadIdx.x; item < mt_count * 32; item += W * 32) {  // (m tile, lane) of the tile
            const int m = item >> 5, ln = item & 31;
            float4 s[NT8];
#pragma unroll
            for (int n = 0; n < NT8; ++n) {
                s[n] = red[(m * NT8 + n) * 32 + ln];
                for (int v = 1; v < W; ++v) {  // the warps' partials in warp order
                    const float4 p = red[((v * 4 + m) * NT8 + n) * 32 + ln];
                    s[n].x += p.x; s[n].y += p.y; s[n].z += p.z; s[n].w += p.w;
                }
            }
            const int r0 = 16 * m + (ln >> 2);
            if constexpr (EPI == SG_EPI_F32) {  // n8 tile n: columns 8 (NT8 tile + n) + [0, 8)
                float* o = reinterpret_cast<float*>(out);
#pragma unroll
                for (int n = 0; n < NT8; ++n) {
                    const int col = 8 * (NT8 * tile + n) + 2 * (ln & 3);
                    if (r0 < rows)
                        *reinterpret_cast<float2*>(o + (long long)r0 * n_out + col) = make_float2(s[n].x, s[n].y);
                    if (r0 + 8 < rows)
                        *reinterpret_cast<float2*>(o + (long long)(r0 + 8) * n_out + col) = make_float2(s[n].z, s[n].w);
                }
            } else {  // the tile's 8 activations: gate rows 8 tile + [0, 8), up rows F + the same;
                      // swiglu.cu's arithmetic on the two values rounded to the storage
                const int col = 8 * tile + 2 * (ln & 3);
                typename D::T* o = reinterpret_cast<typename D::T*>(out);
                const float gate[4] = {s[0].x, s[0].y, s[0].z, s[0].w}, up[4] = {s[1].x, s[1].y, s[1].z, s[1].w};
                typename D::T act[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float gv = D::load(D::store(gate[j])), uv = D::load(D::store(up[j]));
                    act[j] = D::store(gv / (1.0f + expf(-gv)) * uv);
                }
                if (r0 < rows)
                    *reinterpret_cast<unsigned*>(o + (long long)r0 * n_out + col) = (unsigned)act[0] | ((unsigned)act[1] << 16);
                if (r0 + 8 < rows)
                    *reinterpret_cast<unsigned*>(o + (long long)(r0 + 8) * n_out + col) = (unsigned)act[2] | ((unsigned)act[3] << 16);
            }
        }
        if (!more) break;
        __syncthreads();  // the partials are read before the next tile writes them
#pragma unroll
        for (int c = 0; c < CW; ++c)
#pragma unroll
            for (int n = 0; n < NT8; ++n) cur[c][n] = next[c][n];
        ++tile;
    }
}
