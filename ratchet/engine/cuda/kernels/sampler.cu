// One pass over the vocabulary: Gumbel-max sampling, greedy argmax, and the log-softmax of
// the chosen token through an online max / sum of exponentials. No sort. Each row is cut
// into `gridDim.y` equal chunks, one block each, so that a batch of 64 rows still fills the
// GPU; the last block of a row to finish (a counter per row) merges the row's chunks. The
// chunking is fixed (it does not depend on the batch), and argmax with ties to the smaller
// index merges exactly, so tokens never depend on it.
// The recipe is ratchet/engine/rng.py + sampler.py, reproduced bit for bit for the tokens:
//
//   z     = logits / T                       (T = 1 where the row is greedy with T <= 0)
//   x0    = first word of Philox-4x32-10, key (key0, key1), counter (ctr0, v, 0, 0)
//   m     = x0 >> (32 - bits)                the uniform u = (m + 0.5) * 2^-bits
//   g_v   = gumbel[m]                        the host's own -log(-log(u)), tabulated over all
//                                            2^bits values of u, so the noise is the reference's
//                                            bit for bit whatever its float32 log does
//   token = argmax_v (z_v + g_v)             greedy: argmax_v logits_v; first index on ties
//   logprob = (z[token] - m) - log(sum_v exp(z_v - m)), exp in fp32, the sum in fp64
//
// The table is 32 MiB and each read of it lands on its own 32-byte sector, so it is read
// only where it can matter. The pass keys every position with an approximate noise
// g~ = -__logf(-logf(u)) (|g~ - g| < 2e-5, checked over all 2^23 values by gumbel_error);
// a position whose approximate key lies more than `margin` below the block's best
// approximate key cannot be the argmax, since both keys are within margin / 2 of the exact
// ones. Each thread keeps its best approximate key (and where it is) and its second best;
// after the block's maximum is known, the thread's best is re-keyed exactly (one table
// read), and a thread whose second best is also within the margin runs over its positions
// again, re-keying each one that is. The exact keys then decide, ties to the smaller index.
// Built WITHOUT --use_fast_math: the division and the logs must be the IEEE ones.
#include "dtype.cuh"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define SAMPLE_BLOCK 256
#define FLT_MAX_ 3.402823466e+38f

// The keys of one row, and the parts of the first three rounds that do not depend on the
// vocabulary index v (the counter is (ctr0, v, 0, 0)): computed once per thread.
struct PhiloxRow {
    unsigned int k0[10], k1[10];
    unsigned int z1;    // round 1: z = hi(M0 ctr0) ^ k1[0]       (x = v ^ k0[0], y = 0)
    unsigned int w1k;   // round 2 needs w1 ^ k1[1], w1 = lo(M0 ctr0)
    unsigned int x2;    // round 2: x = hi(M1 z1) ^ k0[1]
    unsigned int y2;    // round 2: y = lo(M1 z1)
    unsigned int hi0c;  // round 3: hi(M0 x2)
    unsigned int lo0c;  // round 3: lo(M0 x2)
};

__device__ __forceinline__ void mulhilo(unsigned int m, unsigned int x, unsigned int& hi, unsigned int& lo) {
    const unsigned long long p = (unsigned long long)m * x;  // one IMAD.WIDE.U32
    hi = (unsigned int)(p >> 32);
    lo = (unsigned int)p;
}

__device__ __forceinline__ PhiloxRow philox_row(unsigned int ctr0, unsigned int key0, unsigned int key1) {
    PhiloxRow p;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        p.k0[r] = key0 + (unsigned int)r * PHILOX_W0;
        p.k1[r] = key1 + (unsigned int)r * PHILOX_W1;
    }
    unsigned int hi, lo;
    mulhilo(PHILOX_M0, ctr0, hi, lo);
    p.z1 = hi ^ p.k1[0];
    p.w1k = lo ^ p.k1[1];
    mulhilo(PHILOX_M1, p.z1, hi, lo);
    p.x2 = hi ^ p.k0[1];
    p.y2 = lo;
    mulhilo(PHILOX_M0, p.x2, p.hi0c, p.lo0c);
    return p;
}

// x0 of Philox-4x32-10 at counter (ctr0, v, 0, 0): Random123's rounds, the first three
// partly precomputed (philox_row), the last one only for x.
__device__ __forceinline__ unsigned int philox_x0(const PhiloxRow& p, unsigned int v) {
    unsigned int x, y, z, w, hi0, lo0, hi1, lo1;
    mulhilo(PHILOX_M0, v ^ p.k0[0], hi0, lo0);  // round 2
    z = hi0 ^ p.w1k;
    w = lo0;
    mulhilo(PHILOX_M1, z, hi1, lo1);  // round 3
    x = hi1 ^ p.y2 ^ p.k0[2];
    y = lo1;
    z = p.hi0c ^ w ^ p.k1[2];
    w = p.lo0c;
#pragma unroll
    for (int r = 3; r < 9; ++r) {
        mulhilo(PHILOX_M0, x, hi0, lo0);
        mulhilo(PHILOX_M1, z, hi1, lo1);
        x = hi1 ^ y ^ p.k0[r];
        y = lo1;
        z = hi0 ^ w ^ p.k1[r];
        w = lo0;
    }
    return __umulhi(PHILOX_M1, z) ^ y ^ p.k0[9];
}

__device__ __forceinline__ float lg2_approx(float x) {  // MUFU.LG2, normal inputs only
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float ex2_approx(float x) {  // MUFU.EX2, subnormal results flush to 0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

#define LN2_F 0.693147180559945309f
#define LOG2E_F 1.44269504088896341f

// The approximate noise g~ = -log(-log(u)), u = (m + 0.5) 2^-23 (always a normal float):
// L = -log(u) from the fast log2 (absolute error ~1.7e-7), or, where u > 1 - 2^-10 and that
// error would be large against L, from L = t + t^2 / 2 with t = 1 - u (exact), whose relative
// error is < t^2 / 3; then g~ = -log(L), again the fast log2. |g~ - g| < ~2e-4 (gumbel_error
// measures it over all 2^23 values).
__device__ __forceinline__ float gumbel_approx(unsigned int m) {
    const float u = __uint_as_float(0x3f800000u | m) - 0.99999994f;  // (1 + m 2^-23) - (1 - 2^-24), exact
    const float t = 1.0f - u;                                         // exact for u >= 1/2
    const float L = t < 9.765625e-4f ? t * (1.0f + 0.5f * t) : -LN2_F * lg2_approx(u);
    return -LN2_F * lg2_approx(L);
}

// Argmax with ties to the smaller index.
__device__ __forceinline__ void best_merge(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

__device__ __forceinline__ void lse_merge(float& m, double& s, float m2, double s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2;
        s = s2;
        return;
    }
    if (m2 > m) {
        s = s * (double)expf(m - m2) + s2;
        m = m2;
    } else {
        s += s2 * (double)expf(m2 - m);
    }
}

// Online log-sum-exp of four values at once: one rescale check, fp32 exponentials (MUFU,
// relative error ~1e-6 with the argument's rounding) summed in fp32, then into the fp64 sum.
// -inf (masked) and NaN are skipped.
__device__ __forceinline__ void lse_add4(float& m, double& s, float z0, float z1, float z2, float z3) {
    const float mx = fmaxf(fmaxf(z0, z1), fmaxf(z2, z3));
    if (mx > m) {
        s *= (double)ex2_approx((m - mx) * LOG2E_F);  // 0 when m was -inf
        m = mx;
    }
    float t = 0.f;
    t += z0 > -INFINITY ? ex2_approx((z0 - m) * LOG2E_F) : 0.f;
    t += z1 > -INFINITY ? ex2_approx((z1 - m) * LOG2E_F) : 0.f;
    t += z2 > -INFINITY ? ex2_approx((z2 - m) * LOG2E_F) : 0.f;
    t += z3 > -INFINITY ? ex2_approx((z3 - m) * LOG2E_F) : 0.f;
    s += (double)t;
}

struct Partial {  // one chunk of one row
    double s;     // sum of exp(z - m) over the chunk
    float m;      // max of z
    float bv;     // best exact key (z + g, or the logit when greedy)
    int bi;       // its index
    int pad;
};

__device__ __forceinline__ void reduce_warp(float& m, double& s, float& bv, int& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const double s2 = __shfl_xor_sync(0xffffffffu, s, o);
        const float bv2 = __shfl_xor_sync(0xffffffffu, bv, o);
        const int bi2 = __shfl_xor_sync(0xffffffffu, bi, o);
        lse_merge(m, s, m2, s2);
        best_merge(bv, bi, bv2, bi2);
    }
}

// The block's merge of (m, s, bv, bi); the result is valid in every thread.
__device__ __forceinline__ void reduce_block(float& m, double& s, float& bv, int& bi) {
    __shared__ float sm_m[32], sm_bv[32];
    __shared__ double sm_s[32];
    __shared__ int sm_bi[32];
    reduce_warp(m, s, bv, bi);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = (blockDim.x + 31) >> 5;
    __syncthreads();  // the arrays may still be read from a previous call
    if (lane == 0) {
        sm_m[warp] = m;
        sm_s[warp] = s;
        sm_bv[warp] = bv;
        sm_bi[warp] = bi;
    }
    __syncthreads();
    m = lane < nwarps ? sm_m[lane] : -INFINITY;
    s = lane < nwarps ? sm_s[lane] : 0.0;
    bv = lane < nwarps ? sm_bv[lane] : -INFINITY;
    bi = lane < nwarps ? sm_bi[lane] : 0x7fffffff;
    reduce_warp(m, s, bv, bi);
}

// greedy_flag: bit 0 greedy; the bits above, 1 + a forced token (0: none; see `sample`)
__device__ __forceinline__ float row_temperature(float temp, int greedy_flag, bool& is_greedy) {
    is_greedy = (greedy_flag & 1) != 0 || !(temp > 0.f);
    return is_greedy && !(temp > 0.f) ? 1.0f : temp;
}

// Below the block's best approximate key by more than this: not the argmax. An approximate
// key z + g~ is within 2e-4 + |key| 2^-23 of the exact one; the margin is 25x twice that.
__device__ __forceinline__ float candidate_threshold(float best) {
    const float b = fminf(best, FLT_MAX_);
    return b - (1e-2f + fabsf(b) * 1.52587890625e-05f);  // 2^-16 |b|; -inf stays -inf
}

// z = x / T exactly as the reference divides; DIV false where T == 1 (x / 1 is exact)
template <bool DIV>
__device__ __forceinline__ float scaled(float xv, float T) { return DIV ? xv / T : xv; }

// The first pass over a sampled row's chunk: the online log-sum-exp of z, and each thread's
// best and second-best approximate keys z + g~ (and where the best is).
template <bool DIV>
__device__ __forceinline__ void sampled_pass(const float* __restrict__ x, int begin, int end, float T,
                                             const PhiloxRow& ph, float& m, double& s, float& a1, float& a2,
                                             int& i1) {
    constexpr int U = 4;  // positions per thread per step, SAMPLE_BLOCK apart
    for (int v0 = begin + threadIdx.x; v0 < end; v0 += U * SAMPLE_BLOCK) {
        float z[U];
#pragma unroll
        for (int j = 0; j < U; ++j)
            z[j] = v0 + j * SAMPLE_BLOCK < end ? scaled<DIV>(x[v0 + j * SAMPLE_BLOCK], T) : -INFINITY;
        lse_add4(m, s, z[0], z[1], z[2], z[3]);
#pragma unroll
        for (int j = 0; j < U; ++j) {
            const int v = v0 + j * SAMPLE_BLOCK;
            const float key = z[j] + gumbel_approx(philox_x0(ph, (unsigned int)v) >> 9);  // -inf past the end
            a2 = fmaxf(a2, fminf(a1, key));
            if (key > a1) {
                a1 = key;
                i1 = v;
            }
        }
    }
}

// Re-key exactly, from the table, every position of this thread whose approximate key
// reaches thr.
template <bool DIV>
__device__ __forceinline__ void rekey_pass(const float* __restrict__ x, int begin, int end, float T,
                                           const PhiloxRow& ph, const float* __restrict__ table, float thr,
                                           float& bv, int& bi) {
    for (int v = begin + threadIdx.x; v < end; v += SAMPLE_BLOCK) {
        const float z = scaled<DIV>(x[v], T);
        const unsigned int mu = philox_x0(ph, (unsigned int)v) >> 9;
        if (z + gumbel_approx(mu) >= thr) best_merge(bv, bi, z + __ldg(table + mu), v);
    }
}

// grid (rows, nchunks <= 32) x SAMPLE_BLOCK threads. params: int32 [5, ld]: key0, key1,
// counter, temperature (float32 bits), greedy | (1 + forced token) << 1. counters: int
// [rows], zero before the first launch, left at zero by every launch.
// A forced row (teacher forcing) runs the same pass as if it drew (its max and sum of
// exponentials in the same order) and takes the forced token at the end: its log-probability
// is bit for bit the one the row got when it drew that token.
extern "C" __global__ void __launch_bounds__(SAMPLE_BLOCK, 4)
sample(const float* __restrict__ logits, long long row_stride, int vocab, int chunk,
       const int* __restrict__ params, int ld, const float* __restrict__ gumbel_table,
       Partial* __restrict__ partials, int* __restrict__ counters, int* __restrict__ tokens_out,
       float* __restrict__ logprobs_out) {
    pdl_begin();
    __shared__ int sm_last;
    const int r = blockIdx.x, c = blockIdx.y, nchunks = gridDim.y;
    const float* x = logits + (long long)r * row_stride;
    bool is_greedy;
    const float T = row_temperature(__int_as_float(params[3 * ld + r]), params[4 * ld + r], is_greedy);
    const int begin = c * chunk, end = min(begin + chunk, vocab);
    const bool div = T != 1.0f;

    float m = -INFINITY, bv = -INFINITY;
    double s = 0.0;
    int bi = 0x7fffffff;
    if (is_greedy) {  // the key is the logit: exact already
        constexpr int U = 4;
        for (int v0 = begin + threadIdx.x; v0 < end; v0 += U * SAMPLE_BLOCK) {
            float xv[U];
#pragma unroll
            for (int j = 0; j < U; ++j) xv[j] = v0 + j * SAMPLE_BLOCK < end ? x[v0 + j * SAMPLE_BLOCK] : -INFINITY;
            if (div) lse_add4(m, s, xv[0] / T, xv[1] / T, xv[2] / T, xv[3] / T);
            else lse_add4(m, s, xv[0], xv[1], xv[2], xv[3]);
#pragma unroll
            for (int j = 0; j < U; ++j)
                if (v0 + j * SAMPLE_BLOCK < end) best_merge(bv, bi, xv[j], v0 + j * SAMPLE_BLOCK);
        }
        reduce_block(m, s, bv, bi);
    } else {
        const PhiloxRow ph = philox_row((unsigned int)params[2 * ld + r], (unsigned int)params[r],
                                        (unsigned int)params[ld + r]);
        float a1 = -INFINITY, a2 = -INFINITY;  // best and second-best approximate keys
        int i1 = -1;                            // where the best is
        if (div) sampled_pass<true>(x, begin, end, T, ph, m, s, a1, a2, i1);
        else sampled_pass<false>(x, begin, end, T, ph, m, s, a1, a2, i1);
        float best = a1;  // the block's best approximate key rides in the bv slot
        int unused = 0;
        reduce_block(m, s, best, unused);
        const float thr = candidate_threshold(best);
        if (a2 >= thr) {  // two or more candidates here: re-key each one exactly
            if (div) rekey_pass<true>(x, begin, end, T, ph, gumbel_table, thr, bv, bi);
            else rekey_pass<false>(x, begin, end, T, ph, gumbel_table, thr, bv, bi);
        } else if (i1 >= 0 && a1 >= thr) {
            const unsigned int mu = philox_x0(ph, (unsigned int)i1) >> 9;
            best_merge(bv, bi, (div ? x[i1] / T : x[i1]) + __ldg(gumbel_table + mu), i1);
        }
        float m_unused = -INFINITY;
        double s_unused = 0.0;
        reduce_block(m_unused, s_unused, bv, bi);
    }

    if (threadIdx.x == 0) {
        Partial p;
        p.s = s;
        p.m = m;
        p.bv = bv;
        p.bi = bi;
        p.pad = 0;
        partials[(long long)r * nchunks + c] = p;
        __threadfence();
        sm_last = atomicAdd(counters + r, 1) == nchunks - 1;
    }
    __syncthreads();
    if (!sm_last || threadIdx.x >= 32) return;
    // the row's last block: merge its chunks (one warp), write token and logprob
    __threadfence();
    const int lane = threadIdx.x;
    m = -INFINITY;
    s = 0.0;
    bv = -INFINITY;
    bi = 0x7fffffff;
    if (lane < nchunks) {
        const Partial* p = partials + (long long)r * nchunks + lane;
        s = __ldcg(&p->s);
        m = __ldcg(&p->m);
        bv = __ldcg(&p->bv);
        bi = __ldcg(&p->bi);
    }
    reduce_warp(m, s, bv, bi);
    if (lane == 0) {
        counters[r] = 0;  // ready for the next launch
        const int forced = (params[4 * ld + r] >> 1) - 1;
        if (forced >= 0) bi = forced;
        if (bi < 0 || bi >= vocab) bi = 0;  // all NaN: token 0 and a NaN logprob
        tokens_out[r] = bi;
        logprobs_out[r] = (float)(((double)(x[bi] / T) - (double)m) - log(s));
    }
}

// The approximate noise against the table over every m: out[0] = max |g~ - g| (as float
// bits, atomicMax over non-negative floats), for the test.
extern "C" __global__ void gumbel_error(const float* __restrict__ table, int n, unsigned int* __restrict__ out) {
    pdl_begin();
    float worst = 0.f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        worst = fmaxf(worst, fabsf(gumbel_approx((unsigned int)i) - table[i]));
    worst = warp_max(worst);
    if ((threadIdx.x & 31) == 0) atomicMax(out, __float_as_uint(worst));
}
