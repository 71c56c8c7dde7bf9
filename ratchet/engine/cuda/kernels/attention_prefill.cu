// Prefill attention: causal, GQA, over packed rows of several sequences at once.
//
// Rows of one sequence lie consecutively in `q` [rows, H * HD] and their k, v are already in
// the cache at their positions (rope_qkv ran first), so a row at position p attends to cache
// positions 0 .. p of its slot: the prompt and any prefix cached before.
// The host cuts each sequence into tiles of at most `qt` rows; tiles[i] = (first row, rows,
// slot, position of the first row). A block takes one (tile, kv head); each of its threads
// owns (row, query head, part of the head dims): q and the output accumulator live in
// registers, K and V tiles of KT positions are staged in shared memory as fp32, and the
// softmax is online over those tiles. Arithmetic in fp32; the output rounded once.
#include "dtype.cuh"

#define KT 16  // key positions per shared-memory tile

template <class D, int HD, int G>
__global__ void attn_prefill(const typename D::T* __restrict__ q, const typename D::T* __restrict__ cache,
                             const int4* __restrict__ tiles, typename D::T* __restrict__ out,
                             int num_kv_heads, int max_seq, int qt, float scale) {
    pdl_begin();
    constexpr int DS = HD > 64 ? HD / 64 : 1;  // threads sharing one query vector
    constexpr int PD = HD / DS;                // dims per thread
    static_assert(HD % 8 == 0 && HD % DS == 0 && PD % 4 == 0 && (DS & (DS - 1)) == 0,
                  "unsupported head_dim");
    __shared__ __align__(16) float ks[KT][HD];
    __shared__ __align__(16) float vs[KT][HD];

    const int4 tile = tiles[blockIdx.x];
    const int row0 = tile.x, nrows = tile.y, pos0 = tile.w;
    const long long slot = tile.z;
    const int g = blockIdx.y, t = threadIdx.x;
    const int sub = t % DS, qi = t / DS / G, h = (t / DS) % G;
    const bool active = qi < nrows && t < qt * G * DS;
    const int num_heads = num_kv_heads * G;
    const int limit = pos0 + qi;  // last position this row may see
    const int last = pos0 + nrows - 1;
    const int d0 = sub * PD;

    float qv[PD], acc[PD];
    const long long qoff = ((long long)(row0 + (active ? qi : 0)) * num_heads + g * G + h) * HD + d0;
#pragma unroll
    for (int d = 0; d < PD; d += 8) load8<D>(q + qoff + d, qv + d);
#pragma unroll
    for (int d = 0; d < PD; ++d) acc[d] = 0.f;
    float m = -INFINITY, l = 0.f;

    const typename D::T* kbase = cache + ((slot * 2 + 0) * num_kv_heads + g) * (long long)max_seq * HD;
    const typename D::T* vbase = cache + ((slot * 2 + 1) * num_kv_heads + g) * (long long)max_seq * HD;

    for (int k0 = 0; k0 <= last; k0 += KT) {
        const int nk = min(KT, last + 1 - k0);
        __syncthreads();  // the previous tile is consumed
        for (int i = t * 8; i < nk * HD; i += blockDim.x * 8) {
            float tmp[8];
            load8<D>(kbase + (long long)k0 * HD + i, tmp);
#pragma unroll
            for (int j = 0; j < 8; ++j) ks[0][i + j] = tmp[j];
            load8<D>(vbase + (long long)k0 * HD + i, tmp);
#pragma unroll
            for (int j = 0; j < 8; ++j) vs[0][i + j] = tmp[j];
        }
        __syncthreads();
        float sc[KT];
        float mt = -INFINITY;
#pragma unroll
        for (int j = 0; j < KT; ++j) {
            float dot = 0.f;
            if (j < nk) {
#pragma unroll
                for (int d = 0; d < PD; d += 4) {
                    const float4 kv = *reinterpret_cast<const float4*>(&ks[j][d0 + d]);
                    dot += qv[d] * kv.x + qv[d + 1] * kv.y + qv[d + 2] * kv.z + qv[d + 3] * kv.w;
                }
            }
#pragma unroll
            for (int o = 1; o < DS; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            sc[j] = (j < nk && k0 + j <= limit) ? dot * scale : -INFINITY;
            mt = fmaxf(mt, sc[j]);
        }
        if (mt == -INFINITY) continue;  // nothing visible in this tile (thread-uniform skip is safe: no barrier below)
        const float m_new = fmaxf(m, mt);
        const float alpha = expf(m - m_new);
        l *= alpha;
#pragma unroll
        for (int d = 0; d < PD; ++d) acc[d] *= alpha;
#pragma unroll
        for (int j = 0; j < KT; ++j) {
            if (j < nk) {
                const float p = expf(sc[j] - m_new);
                l += p;
#pragma unroll
                for (int d = 0; d < PD; d += 4) {
                    const float4 vv = *reinterpret_cast<const float4*>(&vs[j][d0 + d]);
                    acc[d] += p * vv.x;
                    acc[d + 1] += p * vv.y;
                    acc[d + 2] += p * vv.z;
                    acc[d + 3] += p * vv.w;
                }
            }
        }
        m = m_new;
    }
    if (active) {
        typename D::T* o = out + ((long long)(row0 + qi) * num_heads + g * G + h) * HD + d0;
#pragma unroll
        for (int d = 0; d < PD; ++d) o[d] = D::store(acc[d] / l);
    }
}
