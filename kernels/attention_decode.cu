// Decode attention (one new query row per sequence) over the KV cache, GQA, split along the
// sequence so that long contexts still fill the GPU; a second kernel combines the splits.
//
// Cache of one layer: [slots, 2, K, max_seq, HD] (k = 0, v = 1). Row r reads slot slots[r],
// positions 0 .. seq_lens[r] - 1. Query heads g*G .. g*G + G - 1 share kv head g (HF repeat_kv).
// Split s of row r covers positions [s * split_len, (s + 1) * split_len); a block handles one
// (split, kv head, row) in tiles of TILE positions with an online softmax, and writes its
// unnormalised output, running max and sum per query head:
//   part_acc [rows, K, nsplit, G, HD], part_ml [rows, K, nsplit, G, 2]   (fp32)
// Scores are fp32 dot products times `scale`; softmax and the weighted sum of V in fp32.
#include "dtype.cuh"

#define TILE 64     // positions per tile == threads per block
#define PV_BATCH 8  // V rows a thread loads ahead in the weighted sum

template <class D, int HD, int G>
__global__ void __launch_bounds__(TILE)
attn_decode_partial(const typename D::T* __restrict__ q, const typename D::T* __restrict__ cache,
                    const int* __restrict__ slots, const int* __restrict__ seq_lens,
                    float* __restrict__ part_acc, float* __restrict__ part_ml,
                    int num_kv_heads, int max_seq, int split_len, int nsplit, float scale) {
    static_assert(HD % 8 == 0 && HD <= 2 * TILE, "head_dim must be a multiple of 8, at most 128");
    constexpr int PAIRS = HD / 2;          // dim pairs, one per thread in the PV phase
    constexpr int GROUPS = TILE / PAIRS;   // position groups in the PV phase
    __shared__ float qs[G][HD];
    __shared__ float sc[G][TILE];
    __shared__ float stat_m[G], stat_l[G], stat_alpha[G];
    __shared__ float red[GROUPS][G][HD];

    const int s = blockIdx.x, g = blockIdx.y, r = blockIdx.z, t = threadIdx.x;
    const int n = seq_lens[r];
    const int start = s * split_len;
    if (start >= n) return;  // the combine reads only the splits that hold positions
    const int end = min(start + split_len, n);
    const int num_heads = num_kv_heads * G;
    const long long slot = slots[r];
    const typename D::T* kbase = cache + ((slot * 2 + 0) * num_kv_heads + g) * (long long)max_seq * HD;
    const typename D::T* vbase = cache + ((slot * 2 + 1) * num_kv_heads + g) * (long long)max_seq * HD;

    for (int i = t; i < G * HD; i += TILE)
        qs[i / HD][i % HD] = D::load(q[(long long)r * num_heads * HD + (long long)g * G * HD + i]);
    if (t < G) {
        stat_m[t] = -INFINITY;
        stat_l[t] = 0.f;
    }
    const int pair = t % PAIRS, grp = t / PAIRS;
    float acc[G][2];
#pragma unroll
    for (int h = 0; h < G; ++h) acc[h][0] = acc[h][1] = 0.f;
    __syncthreads();

    for (int tile = start; tile < end; tile += TILE) {
        const int len = min(TILE, end - tile);
        // scores: thread t takes position tile + t
        if (t < len) {
            float dot[G];
#pragma unroll
            for (int h = 0; h < G; ++h) dot[h] = 0.f;
            const typename D::T* krow = kbase + (long long)(tile + t) * HD;
#pragma unroll
            for (int d = 0; d < HD; d += 8) {
                float k8[8];
                load8<D>(krow + d, k8);
#pragma unroll
                for (int h = 0; h < G; ++h)
#pragma unroll
                    for (int j = 0; j < 8; ++j) dot[h] += qs[h][d + j] * k8[j];
            }
#pragma unroll
            for (int h = 0; h < G; ++h) sc[h][t] = dot[h] * scale;
        } else {
#pragma unroll
            for (int h = 0; h < G; ++h) sc[h][t] = -INFINITY;
        }
        __syncthreads();
        // online softmax, one warp per head at a time
        const int warp = t >> 5, lane = t & 31;
        for (int h = warp; h < G; h += TILE / 32) {
            float mt = -INFINITY;
            for (int j = lane; j < TILE; j += 32) mt = fmaxf(mt, sc[h][j]);
            mt = warp_max(mt);
            const float m_old = stat_m[h];
            const float m_new = fmaxf(m_old, mt);
            float sum = 0.f;
            for (int j = lane; j < TILE; j += 32) {
                const float p = expf(sc[h][j] - m_new);  // exp(-inf) = 0 past the end
                sc[h][j] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            __syncwarp();
            if (lane == 0) {
                const float alpha = expf(m_old - m_new);  // 0 on the first tile
                stat_alpha[h] = alpha;
                stat_l[h] = stat_l[h] * alpha + sum;
                stat_m[h] = m_new;
            }
        }
        __syncthreads();
        // weighted sum of V: thread takes dims (2 pair, 2 pair + 1), positions grp, grp + GROUPS, ...
#pragma unroll
        for (int h = 0; h < G; ++h) {
            acc[h][0] *= stat_alpha[h];
            acc[h][1] *= stat_alpha[h];
        }
        // PV_BATCH positions' loads are issued before their use, so their latencies overlap
        for (int j0 = grp; grp < GROUPS && j0 < len; j0 += PV_BATCH * GROUPS) {
            float v0[PV_BATCH], v1[PV_BATCH];
#pragma unroll
            for (int u = 0; u < PV_BATCH; ++u) {
                const int j = j0 + u * GROUPS;
                v0[u] = v1[u] = 0.f;
                if (j < len) load2<D>(vbase + (long long)(tile + j) * HD + 2 * pair, v0[u], v1[u]);
            }
#pragma unroll
            for (int u = 0; u < PV_BATCH; ++u) {
                const int j = j0 + u * GROUPS;
                if (j < len) {
#pragma unroll
                    for (int h = 0; h < G; ++h) {
                        acc[h][0] += sc[h][j] * v0[u];
                        acc[h][1] += sc[h][j] * v1[u];
                    }
                }
            }
        }
        __syncthreads();
    }
    if (grp < GROUPS) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
            red[grp][h][2 * pair] = acc[h][0];
            red[grp][h][2 * pair + 1] = acc[h][1];
        }
    }
    __syncthreads();
    const long long out = (((long long)r * num_kv_heads + g) * nsplit + s) * G;
    for (int i = t; i < G * HD; i += TILE) {
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < GROUPS; ++k) v += red[k][i / HD][i % HD];
        part_acc[out * HD + i] = v;
    }
    if (t < G) {
        part_ml[(out + t) * 2] = stat_m[t];
        part_ml[(out + t) * 2 + 1] = stat_l[t];
    }
}

// One block of HD threads per (row, query head): merge the splits, normalise, round.
template <class D, int HD, int G>
__global__ void attn_decode_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                    const int* __restrict__ seq_lens, typename D::T* __restrict__ out,
                                    int num_kv_heads, int split_len, int nsplit) {
    const int r = blockIdx.x, qh = blockIdx.y, d = threadIdx.x;
    const int g = qh / G, h = qh % G;
    const int ns = (seq_lens[r] + split_len - 1) / split_len;
    const long long base = ((long long)r * num_kv_heads + g) * nsplit;
    float m = -INFINITY;
    for (int s = 0; s < ns; ++s) m = fmaxf(m, part_ml[((base + s) * G + h) * 2]);
    float l = 0.f, acc = 0.f;
    for (int s = 0; s < ns; ++s) {
        const long long i = (base + s) * G + h;
        const float w = expf(part_ml[i * 2] - m);
        l += part_ml[i * 2 + 1] * w;
        acc += part_acc[i * HD + d] * w;
    }
    out[((long long)r * num_kv_heads * G + qh) * HD + d] = D::store(acc / l);
}
