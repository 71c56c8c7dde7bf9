// NOT BUILT: kept for reference (kernels/NOTES.md, run 3). A fused decode attention that was
// correct on the H200 (all GPU tests) but slower than attention_decode.cu: 17.4 us a layer at
// B=64, ctx 384, against 12.5 + 3.4 us. To try it again: move it up to kernels/, name it in
// loader.expressions, and pass an int32 [rows * K] zeroed counter array from the launcher
// (grid (nsplit, K, rows) x 128 threads).
// Decode attention (one new query row per sequence) over the KV cache, GQA, split along the
// sequence so that long contexts still fill the GPU; the last block of a (row, kv head) to
// finish merges the splits (one launch).
//
// Cache of one layer: [slots, 2, K, max_seq, HD] (k = 0, v = 1). Row r reads slot slots[r],
// positions 0 .. seq_lens[r] - 1. Query heads g*G .. g*G + G - 1 share kv head g (HF repeat_kv).
// Split s of row r covers positions [s * split_len, (s + 1) * split_len); a block of 128
// threads handles one (split, kv head, row) in tiles of TILE positions with an online softmax:
//   - each tile's K rows go straight to registers (two threads a position, HD/2 dims each,
//     16-byte loads) and its V rows to shared memory (cp.async), all issued before any use;
//   - scores for the G heads of the group (fp32 dot products times `scale`), the softmax
//     statistics one warp a head, then the weighted sum of V in fp32 (thread: two dims, a
//     quarter of the positions for HD = 64).
// A row whose positions fit in one split writes its output at once. Otherwise each split
// writes its unnormalised output, running max and sum per query head:
//   part_acc [rows, K, nsplit, G, HD], part_ml [rows, K, nsplit, G, 2]   (fp32)
// and counts itself in counters[r * K + g]; the last one merges the splits in order (so the
// result does not depend on which block finished last) and resets the counter to 0.
#include "dtype.cuh"

#define TILE 64           // positions per tile
#define ATTN_THREADS 128  // two threads a position in the score phase

__device__ __forceinline__ unsigned int smem_u32(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void cp_async16(void* dst_smem, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst_smem)), "l"(src));
}

__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
}

template <class D, int HD, int G>
__global__ void __launch_bounds__(ATTN_THREADS, 6)
attn_decode(const typename D::T* __restrict__ q, const typename D::T* __restrict__ cache,
            const int* __restrict__ slots, const int* __restrict__ seq_lens,
            float* __restrict__ part_acc, float* __restrict__ part_ml, int* __restrict__ counters,
            typename D::T* __restrict__ out, int num_kv_heads, int max_seq, int split_len, int nsplit,
            float scale) {
    typedef typename D::T T;
    static_assert(HD % 16 == 0 && HD >= 16 && HD <= 128, "head_dim: a multiple of 16, 16 .. 128");
    constexpr int HALF = HD / 2;                    // dims per thread in the score phase
    constexpr int NV = Vec16<D>::N;                   // values per 16-byte load
    constexpr int KLOADS = HALF / NV;               // 16-byte K loads per thread per tile
    constexpr int QROW = HD + 4;                    // q row in shared memory: halves 4 floats apart
    constexpr int PAIRS = HD / 2;                   // dim pairs, one per thread in the PV phase
    constexpr int GROUPS = ATTN_THREADS / PAIRS;    // position groups in the PV phase
    constexpr int VROW = HD * (int)sizeof(T) / 16;  // 16-byte pieces of a V row
    static_assert(HALF % NV == 0 && ATTN_THREADS % PAIRS == 0 && TILE % GROUPS == 0, "shape");
    __shared__ __align__(16) float qs[G][QROW];  // read as float4
    __shared__ float pr[G][TILE];  // scores, then probabilities
    __shared__ float stat_m[G], stat_l[G], stat_alpha[G];
    __shared__ float red[GROUPS][G][HD];
    __shared__ __align__(16) T vs[TILE][HD];
    __shared__ float wts[32][G];
    __shared__ int sm_last;

    const int s = blockIdx.x, g = blockIdx.y, r = blockIdx.z, t = threadIdx.x;
    const int n = seq_lens[r];
    const int start = s * split_len;
    if (start >= n) return;  // splits past the end hold no positions: the merge skips them
    const int end = min(start + split_len, n);
    const int ns = (n + split_len - 1) / split_len;  // splits that hold positions
    const int num_heads = num_kv_heads * G;
    const long long slot = slots[r];
    const T* kbase = cache + ((slot * 2 + 0) * num_kv_heads + g) * (long long)max_seq * HD;
    const T* vbase = cache + ((slot * 2 + 1) * num_kv_heads + g) * (long long)max_seq * HD;

    const int kp = t >> 1, khalf = t & 1;             // score phase: position, half of the dims
    const int pair = t % PAIRS, grp = t / PAIRS;      // PV phase: dims 2 pair, 2 pair + 1
    float acc[G][2];
#pragma unroll
    for (int h = 0; h < G; ++h) acc[h][0] = acc[h][1] = 0.f;

    for (int tile = start; tile < end; tile += TILE) {
        const int len = min(TILE, end - tile);
        // issue every load of the tile first: V rows to shared memory, this thread's K half-row
        for (int i = t; i < len * VROW; i += ATTN_THREADS)
            cp_async16(reinterpret_cast<uint4*>(&vs[0][0]) + i,
                       reinterpret_cast<const uint4*>(vbase + (long long)tile * HD) + i);
        uint4 kv[KLOADS];
        if (kp < len) {
            const uint4* krow = reinterpret_cast<const uint4*>(kbase + (long long)(tile + kp) * HD + khalf * HALF);
#pragma unroll
            for (int i = 0; i < KLOADS; ++i) kv[i] = krow[i];
        }
        if (tile == start) {
            for (int i = t; i < G * HD; i += ATTN_THREADS) {
                const int h = i / HD, d = i % HD;
                qs[h][d < HALF ? d : d + 4] = D::load(q[(long long)r * num_heads * HD + (long long)g * G * HD + i]);
            }
            if (t < G) {
                stat_m[t] = -INFINITY;
                stat_l[t] = 0.f;
            }
            __syncthreads();
        }
        // scores: this thread's half of the dot products, the pair's halves summed by a shuffle
        float dot[G];
#pragma unroll
        for (int h = 0; h < G; ++h) dot[h] = 0.f;
        if (kp < len) {
#pragma unroll
            for (int i = 0; i < KLOADS; ++i) {
                float kf[NV];
                unpack16<D>(kv[i], kf);
#pragma unroll
                for (int h = 0; h < G; ++h) {
                    const float4* qh = reinterpret_cast<const float4*>(&qs[h][khalf * (HALF + 4) + i * NV]);
#pragma unroll
                    for (int j = 0; j < NV / 4; ++j) {
                        const float4 q4 = qh[j];
                        dot[h] += q4.x * kf[4 * j] + q4.y * kf[4 * j + 1] + q4.z * kf[4 * j + 2] + q4.w * kf[4 * j + 3];
                    }
                }
            }
        }
#pragma unroll
        for (int h = 0; h < G; ++h) dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], 1);
        if (khalf == 0) {
#pragma unroll
            for (int h = 0; h < G; ++h) pr[h][kp] = kp < len ? dot[h] * scale : -INFINITY;
        }
        __syncthreads();
        // online softmax, one warp a head
        const int warp = t >> 5, lane = t & 31;
        for (int h = warp; h < G; h += ATTN_THREADS / 32) {
            float mt = -INFINITY;
#pragma unroll
            for (int j = lane; j < TILE; j += 32) mt = fmaxf(mt, pr[h][j]);
            mt = warp_max(mt);
            const float m_old = stat_m[h];
            const float m_new = fmaxf(m_old, mt);
            float sum = 0.f;
#pragma unroll
            for (int j = lane; j < TILE; j += 32) {
                const float p = expf(pr[h][j] - m_new);  // exp(-inf) = 0 past the end
                pr[h][j] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float alpha = expf(m_old - m_new);  // 0 on the first tile
                stat_alpha[h] = alpha;
                stat_l[h] = stat_l[h] * alpha + sum;
                stat_m[h] = m_new;
            }
        }
        cp_async_wait_all();
        __syncthreads();
        // weighted sum of V: dims (2 pair, 2 pair + 1), positions grp, grp + GROUPS, ...
#pragma unroll
        for (int h = 0; h < G; ++h) {
            acc[h][0] *= stat_alpha[h];
            acc[h][1] *= stat_alpha[h];
        }
#pragma unroll 2
        for (int j = grp; j < len; j += GROUPS) {
            float v0, v1;
            load2<D>(&vs[j][2 * pair], v0, v1);
#pragma unroll
            for (int h = 0; h < G; ++h) {
                const float p = pr[h][j];
                acc[h][0] += p * v0;
                acc[h][1] += p * v1;
            }
        }
        __syncthreads();  // pr and vs are rewritten by the next tile
    }
#pragma unroll
    for (int h = 0; h < G; ++h) {
        red[grp][h][2 * pair] = acc[h][0];
        red[grp][h][2 * pair + 1] = acc[h][1];
    }
    __syncthreads();
    T* orow = out + (long long)r * num_heads * HD + (long long)g * G * HD;
    if (ns == 1) {  // the only split: normalise and write
        for (int i = t; i < G * HD; i += ATTN_THREADS) {
            const int h = i / HD, d = i % HD;
            float v = 0.f;
#pragma unroll
            for (int k = 0; k < GROUPS; ++k) v += red[k][h][d];
            orow[i] = D::store(v / stat_l[h]);
        }
        return;
    }
    const long long pbase = ((long long)r * num_kv_heads + g) * nsplit;
    for (int i = t; i < G * HD; i += ATTN_THREADS) {
        const int h = i / HD, d = i % HD;
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < GROUPS; ++k) v += red[k][h][d];
        part_acc[(pbase + s) * G * HD + i] = v;
    }
    if (t < G) {
        part_ml[((pbase + s) * G + t) * 2] = stat_m[t];
        part_ml[((pbase + s) * G + t) * 2 + 1] = stat_l[t];
    }
    __threadfence();
    __syncthreads();
    if (t == 0) sm_last = atomicAdd(counters + r * num_kv_heads + g, 1) == ns - 1;
    __syncthreads();
    if (!sm_last) return;
    // the last split of (row, kv head) to finish: merge every split in order
    __threadfence();
    if (t < G) {
        float m = -INFINITY;
        for (int k = 0; k < ns; ++k) m = fmaxf(m, __ldcg(&part_ml[((pbase + k) * G + t) * 2]));
        float l = 0.f;
        for (int k = 0; k < ns; ++k) {
            const float w = expf(__ldcg(&part_ml[((pbase + k) * G + t) * 2]) - m);
            wts[k][t] = w;
            l += __ldcg(&part_ml[((pbase + k) * G + t) * 2 + 1]) * w;
        }
        stat_l[t] = l;
    }
    if (t == 0) counters[r * num_kv_heads + g] = 0;  // ready for the next launch
    __syncthreads();
    for (int i = t; i < G * HD; i += ATTN_THREADS) {
        const int h = i / HD;
        float v = 0.f;
        for (int k = 0; k < ns; ++k) v += __ldcg(&part_acc[(pbase + k) * G * HD + i]) * wts[k][h];
        orow[i] = D::store(v / stat_l[h]);
    }
}
