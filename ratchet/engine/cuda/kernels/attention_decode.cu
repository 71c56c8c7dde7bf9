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
#include "rope.cuh"

#define TILE 64     // positions per tile == threads per block
#define PV_BATCH 8  // V rows a thread loads ahead in the weighted sum

template <class D, int HD, int G>
__global__ void __launch_bounds__(TILE)
attn_decode_partial(const typename D::T* __restrict__ q, const typename D::T* __restrict__ cache,
                    const int* __restrict__ slots, const int* __restrict__ seq_lens,
                    float* __restrict__ part_acc, float* __restrict__ part_ml,
                    int num_kv_heads, int max_seq, int split_len, int nsplit, float scale) {
    pdl_begin();
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
    pdl_begin();
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

// ------------------------------------------------------------------------------------------
// Tensor-core decode attention: fp16 / bf16, head_dim 64 or 128, at most 16 query heads a kv
// head (Qwen2.5-0.5B: 64, 7). The kernel above spends 2 G HD fp32 FMAs a position on the G
// heads of a group; here the group's heads are the M rows of mma.m16n8k16 (rows >= G are
// zero), so one K/V tile feeds them all from the tensor cores. No shared memory in the loop:
// - scores S = Q K^T (B operand K^T): the order of the head_dim sum is free, so lane
//   (n, t) of a fragment takes the dims of its own 16-byte loads, K[pos n][t HD/4, +HD/4),
//   and the query fragments are read in the same order of dims;
// - output O = P V (B operand V): the order of the output dims is free as well (undone at the
//   store), so lane (n, t) takes dims [n HD/8, +HD/8) of the four positions its fragment
//   needs (16-byte loads) and pairs them with byte permutes;
// - P is the A operand straight from the score accumulators (FlashAttention-2's layout),
//   as a sum of two fp16 or three bf16 terms: the weighted sum keeps ~22-24 bits of P, as
//   the fp32 reference does, not the 11 or 8 of a single rounding.
// RoPE can come fused (qkv != null): the block rounds q + bias and rotates its group's query
// heads into shared memory, and the split that holds the new position (seq_lens[r] - 1) also
// writes that position's k (rotated) and v into the cache before its warps read it; the
// arithmetic is rope.cu's (both call rope.cuh), so q and the cache hold the same bits as
// after rope_qkv. The cache is then read with coherent loads (no
// __restrict__ / const: the read-only path does not see a kernel's own writes).
// A block of W warps (W = blockDim.x / 32, at most MMA_MAX_WARPS, half that at head_dim 128
// so that the registers of a thread need not spill) takes one split of (row,
// kv head); warp w its tiles w, w + W, ..., each with an online softmax in registers; the
// warps merge through shared memory (dynamic: W G (HD + 2) floats), and the block writes the
// normalised output (nsplit == 1: no combine) or its split's partials for the combine.
#define MMA_MAX_WARPS 16

template <class D>
struct TensorCore;

template <>
struct TensorCore<F16> {
    static constexpr int TERMS = 2;  // fp16 terms of P: 11 + 11 bits
    static __device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <>
struct TensorCore<BF16> {
    static constexpr int TERMS = 3;  // bf16 terms of P: 8 + 8 + 8 bits
    static __device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

__device__ __forceinline__ unsigned word_of(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// x, y (fp32) as TERMS packed pairs whose sum is x, y to ~8 TERMS + 6 bits: each term is the
// rounding of what the previous ones left (the difference is exact in fp32).
template <class D, int TERMS>
__device__ __forceinline__ void split_pair(float x, float y, unsigned* out, int stride) {
#pragma unroll
    for (int i = 0; i < TERMS; ++i) {
        const typename D::T hx = D::store(x), hy = D::store(y);
        out[i * stride] = (unsigned)hx | ((unsigned)hy << 16);
        x -= D::load(hx);
        y -= D::load(hy);
    }
}

template <class D, int HD, int G>
__global__ void __launch_bounds__(HD == 64 ? MMA_MAX_WARPS * 32 : MMA_MAX_WARPS * 16)
attn_decode_mma(const typename D::T* __restrict__ q, typename D::T* cache,
                const int* __restrict__ slots, const int* __restrict__ seq_lens,
                float* __restrict__ part_acc, float* __restrict__ part_ml, typename D::T* __restrict__ out,
                int num_kv_heads, int max_seq, int split_len, int nsplit, float scale,
                const float* __restrict__ qkv, const typename D::T* __restrict__ bias,
                const float* __restrict__ cos_table, const float* __restrict__ sin_table) {
    pdl_begin();
    static_assert(HD == 64 || HD == 128, "head_dim 64 or 128");
    static_assert(G >= 1 && G <= 16, "at most 16 query heads a kv head");
    typedef typename D::T T;
    typedef TensorCore<D> TC;
    constexpr int HALVES = G > 8 ? 2 : 1;     // fragment rows in use: n, and n + 8 past 8 heads
    constexpr int WTILE = HD == 64 ? 32 : 16;  // positions a warp takes at a time
    constexpr int SN = WTILE / 8;              // score n-tiles (8 positions each)
    constexpr int KS = HD / 16;               // k-steps of S = Q K^T
    constexpr int K4 = HD / 32;               // 16-byte K loads a lane makes per position
    constexpr int NT = HD / 8;                // output n-tiles; lane n holds dims [n NT, n NT + NT)
    constexpr int V4 = NT / 8;                // 16-byte V loads a lane makes per position
    constexpr int PK = WTILE / 16;             // k-steps of O = P V
    constexpr int TERMS = TC::TERMS;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);

    extern __shared__ float merge_s[];  // m [W][G], l [W][G], acc [W][G][HD]
    __shared__ __align__(16) T q_s[G][HD];  // the rotated queries when RoPE is fused

    const int s = blockIdx.x, g = blockIdx.y, r = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int fn = lane >> 2, ft = lane & 3;  // fragment row ("groupID") and column pair
    const int n = seq_lens[r];
    const int start = s * split_len;
    if (start >= n) return;  // the whole block: the combine reads only splits that hold positions
    const int end = min(start + split_len, n);
    const int num_heads = num_kv_heads * G;
    const long long slot = slots[r];
    const T* kbase = cache + ((slot * 2 + 0) * num_kv_heads + g) * (long long)max_seq * HD;
    const T* vbase = cache + ((slot * 2 + 1) * num_kv_heads + g) * (long long)max_seq * HD;

    if (qkv != nullptr) {  // fused RoPE: rope.cu's steps for the group's q heads, k and v
        constexpr int HALF = HD / 2;
        const int pos = n - 1;
        const bool writes_new = pos >= start && pos < end;
        const float* x = qkv + (long long)r * (num_heads + 2 * num_kv_heads) * HD;
        for (int p = threadIdx.x; p < (G + 2) * HALF; p += blockDim.x) {
            const int hh = p / HALF, i = p - hh * HALF;  // hh: G query heads, then k, then v
            if (hh >= G && !writes_new) break;
            const int head = hh < G ? g * G + hh : num_heads + (hh - G) * num_kv_heads + g;
            const int c0 = head * HD + i, c1 = c0 + HALF;
            float a = x[c0], b = x[c1];
            bias_round<D>(a, b, bias, c0, c1);
            if (hh <= G)  // q and k rotate, v does not
                rotate_pair(a, b, cos_table[(long long)pos * HALF + i], sin_table[(long long)pos * HALF + i]);
            if (hh < G) {
                q_s[hh][i] = D::store(a);
                q_s[hh][i + HALF] = D::store(b);
            } else {
                T* dst = cache + (((slot * 2 + (hh - G)) * num_kv_heads + g) * (long long)max_seq + pos) * HD;
                dst[i] = D::store(a);
                dst[i + HALF] = D::store(b);
            }
        }
        __syncthreads();  // q_s and the new k, v are the block's to read from here
    }

    // query fragments: heads fn and fn + 8 of the group, dims [ft HD/4, +HD/4) in k-step order
    unsigned qa[KS][4];
    {
        const T* qg = qkv != nullptr ? &q_s[0][0] + ft * (HD / 4)
                                     : q + (long long)r * num_heads * HD + (long long)g * G * HD + ft * (HD / 4);
        uint4 w0[K4], w1[K4];
#pragma unroll
        for (int u = 0; u < K4; ++u) {
            w0[u] = fn < G ? *reinterpret_cast<const uint4*>(qg + fn * HD + 8 * u) : zero;
            w1[u] = fn + 8 < G ? *reinterpret_cast<const uint4*>(qg + (fn + 8) * HD + 8 * u) : zero;
        }
#pragma unroll
        for (int j = 0; j < KS; ++j) {
            qa[j][0] = word_of(w0[(2 * j) / 4], (2 * j) % 4);
            qa[j][1] = word_of(w1[(2 * j) / 4], (2 * j) % 4);
            qa[j][2] = word_of(w0[(2 * j + 1) / 4], (2 * j + 1) % 4);
            qa[j][3] = word_of(w1[(2 * j + 1) / 4], (2 * j + 1) % 4);
        }
    }

    float m[HALVES], l[HALVES], acc[NT][4];
#pragma unroll
    for (int hh = 0; hh < HALVES; ++hh) {
        m[hh] = -INFINITY;
        l[hh] = 0.f;
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;

    for (int tile = start + warp * WTILE; tile < end; tile += warps * WTILE) {
        // every load of the tile first: K of score n-tile i at position tile + 8 i + fn, V of
        // k-step c at positions tile + 16 c + {2 ft, 2 ft + 1, 8 + 2 ft, 9 + 2 ft}; past the end, zeros
        uint4 kr[SN][K4], vr[PK][4][V4];
#pragma unroll
        for (int i = 0; i < SN; ++i) {
            const int pos = tile + 8 * i + fn;
            const T* src = kbase + (long long)pos * HD + ft * (HD / 4);
#pragma unroll
            for (int u = 0; u < K4; ++u) kr[i][u] = pos < end ? *reinterpret_cast<const uint4*>(src + 8 * u) : zero;
        }
#pragma unroll
        for (int c = 0; c < PK; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int pos = tile + 16 * c + 8 * (e >> 1) + 2 * ft + (e & 1);
                const T* src = vbase + (long long)pos * HD + fn * NT;
#pragma unroll
                for (int u = 0; u < V4; ++u)
                    vr[c][e][u] = pos < end ? *reinterpret_cast<const uint4*>(src + 8 * u) : zero;
            }

        // S = Q K^T: lane holds rows fn (c0, c1) and fn + 8 (c2, c3), positions 8 i + 2 ft, +1
        float sc[SN][4];
#pragma unroll
        for (int i = 0; i < SN; ++i) {
            sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
            for (int j = 0; j < KS; ++j)
                TC::mma(sc[i], qa[j], word_of(kr[i][(2 * j) / 4], (2 * j) % 4),
                        word_of(kr[i][(2 * j + 1) / 4], (2 * j + 1) % 4));
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int pos = tile + 8 * i + 2 * ft + (e & 1);
                sc[i][e] = pos < end ? sc[i][e] * scale : -INFINITY;
            }
        }

        // online softmax a row: the tile's max over the fragment's quad, then p = exp(s - m)
#pragma unroll
        for (int hh = 0; hh < HALVES; ++hh) {
            float mt = -INFINITY;
#pragma unroll
            for (int i = 0; i < SN; ++i) mt = fmaxf(mt, fmaxf(sc[i][2 * hh], sc[i][2 * hh + 1]));
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
            const float m_new = fmaxf(m[hh], mt);  // finite: the tile holds a position
            const float alpha = expf(m[hh] - m_new);  // 0 on the warp's first tile
            float sum = 0.f;
#pragma unroll
            for (int i = 0; i < SN; ++i)
#pragma unroll
                for (int e = 2 * hh; e < 2 * hh + 2; ++e) {
                    sc[i][e] = expf(sc[i][e] - m_new);  // exp(-inf) = 0 past the end
                    sum += sc[i][e];
                }
            l[hh] = l[hh] * alpha + sum;  // the lane's share; the quad's sum at the end
            m[hh] = m_new;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                acc[t][2 * hh] *= alpha;
                acc[t][2 * hh + 1] *= alpha;
            }
        }

        // O += P V, k-step c: P from score n-tiles 2c (positions 16 c + 2 ft, +1) and 2c + 1 (+8)
#pragma unroll
        for (int c = 0; c < PK; ++c) {
            unsigned pa[TERMS][4];
            split_pair<D, TERMS>(sc[2 * c][0], sc[2 * c][1], &pa[0][0], 4);
            split_pair<D, TERMS>(sc[2 * c + 1][0], sc[2 * c + 1][1], &pa[0][2], 4);
            if (HALVES == 2) {
                split_pair<D, TERMS>(sc[2 * c][2], sc[2 * c][3], &pa[0][1], 4);
                split_pair<D, TERMS>(sc[2 * c + 1][2], sc[2 * c + 1][3], &pa[0][3], 4);
            } else {
#pragma unroll
                for (int k = 0; k < TERMS; ++k) pa[k][1] = pa[k][3] = 0u;
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                // B fragment: V[pos][fn NT + t] at positions (2 ft, 2 ft + 1) and (8 + 2 ft, 9 + 2 ft)
                const int u = t / 8, w = (t % 8) / 2;
                const unsigned sel = (t & 1) ? 0x7632u : 0x5410u;  // high or low halves of two words
                const unsigned b0 = __byte_perm(word_of(vr[c][0][u], w), word_of(vr[c][1][u], w), sel);
                const unsigned b1 = __byte_perm(word_of(vr[c][2][u], w), word_of(vr[c][3][u], w), sel);
#pragma unroll
                for (int k = 0; k < TERMS; ++k) TC::mma(acc[t], pa[k], b0, b1);
            }
        }
    }

    // merge the warps: each writes its row state; output dim of (t, column n) is n NT + t
    float* m_s = merge_s;
    float* l_s = merge_s + warps * G;
    float* acc_s = merge_s + 2 * warps * G;
#pragma unroll
    for (int hh = 0; hh < HALVES; ++hh) {
        l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 1);
        l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 2);
        const int row = fn + 8 * hh;
        if (row < G) {
            if (ft == 0) {
                m_s[warp * G + row] = m[hh];
                l_s[warp * G + row] = l[hh];
            }
            float* a = acc_s + (warp * G + row) * HD;
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                a[(2 * ft) * NT + t] = acc[t][2 * hh];
                a[(2 * ft + 1) * NT + t] = acc[t][2 * hh + 1];
            }
        }
    }
    __syncthreads();
    const long long part = ((long long)r * num_kv_heads + g) * nsplit + s;
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
        const int h = i / HD, d = i % HD;
        float mx = -INFINITY;
        for (int w = 0; w < warps; ++w) mx = fmaxf(mx, m_s[w * G + h]);  // warp 0 holds a position
        float sum = 0.f, a = 0.f;
        for (int w = 0; w < warps; ++w) {
            const float wt = expf(m_s[w * G + h] - mx);  // 0 for a warp without positions
            sum += l_s[w * G + h] * wt;
            a += acc_s[(w * G + h) * HD + d] * wt;
        }
        if (nsplit == 1) {
            out[((long long)r * num_heads + g * G + h) * HD + d] = D::store(a / sum);
        } else {
            part_acc[(part * G + h) * HD + d] = a;
            if (d == 0) {
                part_ml[(part * G + h) * 2] = mx;
                part_ml[(part * G + h) * 2 + 1] = sum;
            }
        }
    }
}
