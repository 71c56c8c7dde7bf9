// One pass over the vocabulary: Gumbel-max sampling, greedy argmax, and the log-softmax of
// the chosen token through an online max / sum of exponentials. No sort. Each row is cut
// into `nchunks` equal chunks, one block each (sample_partial), so that a batch of 64 rows
// still fills the GPU; sample_combine merges a row's chunks. The chunking is fixed (it does
// not depend on the batch), and argmax with ties to the smaller index merges exactly, so
// tokens never depend on it.
// The recipe is ratchet/engine/rng.py + sampler.py, reproduced bit for bit for the tokens:
//
//   z     = logits / T                       (T = 1 where the row is greedy with T <= 0)
//   x0    = first word of Philox-4x32-10, key (key0, key1), counter (ctr0, v, 0, 0)
//   m     = x0 >> (32 - bits)                the uniform u = (m + 0.5) * 2^-bits
//   g_v   = gumbel[m]                        the host's own -log(-log(u)), tabulated over all
//                                            2^bits values of u, so the noise is the reference's
//                                            bit for bit whatever its float32 log does; without
//                                            a table: -log(-log(u)), each log correctly rounded
//   token = argmax_v (z_v + g_v)             greedy: argmax_v logits_v; first index on ties
//   logprob = (z[token] - m) - log(sum_v exp(z_v - m)), exp in fp32, the sum in fp64
// Built WITHOUT --use_fast_math: the division and the logs must be the IEEE ones.
#include "dtype.cuh"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, unsigned int k0, unsigned int k1) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        const unsigned int hi0 = __umulhi(PHILOX_M0, c.x), lo0 = PHILOX_M0 * c.x;
        const unsigned int hi1 = __umulhi(PHILOX_M1, c.z), lo1 = PHILOX_M1 * c.z;
        c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
    }
    return c;
}

__device__ __forceinline__ float log_rn(float x) { return (float)log((double)x); }

__device__ __forceinline__ float gumbel(const float* __restrict__ table, int bits, unsigned int k0,
                                        unsigned int k1, unsigned int ctr0, unsigned int v) {
    const unsigned int m = philox4x32_10(make_uint4(ctr0, v, 0u, 0u), k0, k1).x >> (32 - bits);
    if (table != nullptr) return __ldg(table + m);
    const float u = ((float)m + 0.5f) * __int_as_float((127 - bits) << 23);  // exact: 2^-bits
    return -log_rn(-log_rn(u));
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

struct Partial {  // one chunk of one row
    double s;     // sum of exp(z - m) over the chunk
    float m;      // max of z
    float bv;     // best key (z + g, or the logit when greedy)
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

__device__ __forceinline__ float row_temperature(float temp, int greedy_flag, bool& is_greedy) {
    is_greedy = greedy_flag != 0 || !(temp > 0.f);
    return is_greedy && !(temp > 0.f) ? 1.0f : temp;
}

// grid (rows, nchunks), any block size that is a multiple of 32 (up to 1024)
extern "C" __global__ void __launch_bounds__(1024)
sample_partial(const float* __restrict__ logits, long long row_stride, int vocab, int chunk,
               const unsigned int* __restrict__ key0, const unsigned int* __restrict__ key1,
               const unsigned int* __restrict__ ctr0, const float* __restrict__ temperatures,
               const int* __restrict__ greedy, const float* __restrict__ gumbel_table, int uniform_bits,
               Partial* __restrict__ partials) {
    __shared__ float sm_m[32], sm_bv[32];
    __shared__ double sm_s[32];
    __shared__ int sm_bi[32];
    const int r = blockIdx.x, c = blockIdx.y;
    const float* x = logits + (long long)r * row_stride;
    bool is_greedy;
    const float T = row_temperature(temperatures[r], greedy[r], is_greedy);
    const unsigned int k0 = key0[r], k1 = key1[r], c0 = ctr0[r];
    const int begin = c * chunk, end = min(begin + chunk, vocab);

    float m = -INFINITY, bv = -INFINITY;
    double s = 0.0;
    int bi = 0x7fffffff;
#pragma unroll 4
    for (int v = begin + threadIdx.x; v < end; v += blockDim.x) {
        const float xv = x[v];
        const float z = T == 1.0f ? xv : xv / T;  // x / 1 is exact: skip the IEEE division
        if (z > m) {  // online log-sum-exp
            s = (m == -INFINITY ? 0.0 : s * (double)expf(m - z)) + 1.0;
            m = z;
        } else if (z > -INFINITY) {  // skips -inf (masked) and NaN
            s += (double)expf(z - m);
        }
        const float key = is_greedy ? xv : z + gumbel(gumbel_table, uniform_bits, k0, k1, c0, (unsigned int)v);
        best_merge(bv, bi, key, v);
    }
    reduce_warp(m, s, bv, bi);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = (blockDim.x + 31) >> 5;
    if (lane == 0) {
        sm_m[warp] = m;
        sm_s[warp] = s;
        sm_bv[warp] = bv;
        sm_bi[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < nwarps ? sm_m[lane] : -INFINITY;
        s = lane < nwarps ? sm_s[lane] : 0.0;
        bv = lane < nwarps ? sm_bv[lane] : -INFINITY;
        bi = lane < nwarps ? sm_bi[lane] : 0x7fffffff;
        reduce_warp(m, s, bv, bi);
        if (lane == 0) {
            Partial p;
            p.s = s;
            p.m = m;
            p.bv = bv;
            p.bi = bi;
            p.pad = 0;
            partials[(long long)r * gridDim.y + c] = p;
        }
    }
}

// grid (rows), one warp per row: merge the row's chunks (at most 32), write token and logprob
extern "C" __global__ void __launch_bounds__(32)
sample_combine(const float* __restrict__ logits, long long row_stride, int vocab, int nchunks,
               const float* __restrict__ temperatures, const int* __restrict__ greedy,
               const Partial* __restrict__ partials, int* __restrict__ tokens_out,
               float* __restrict__ logprobs_out) {
    const int r = blockIdx.x, lane = threadIdx.x;
    float m = -INFINITY, bv = -INFINITY;
    double s = 0.0;
    int bi = 0x7fffffff;
    if (lane < nchunks) {
        const Partial p = partials[(long long)r * nchunks + lane];
        m = p.m;
        s = p.s;
        bv = p.bv;
        bi = p.bi;
    }
    reduce_warp(m, s, bv, bi);
    if (lane == 0) {
        bool is_greedy;
        const float T = row_temperature(temperatures[r], greedy[r], is_greedy);
        if (bi < 0 || bi >= vocab) bi = 0;  // all NaN: token 0 and a NaN logprob
        const float* x = logits + (long long)r * row_stride;
        tokens_out[r] = bi;
        logprobs_out[r] = (float)(((double)(x[bi] / T) - (double)m) - log(s));
    }
}
