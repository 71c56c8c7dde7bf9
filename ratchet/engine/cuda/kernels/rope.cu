// Bias + rotary embedding on the fused qkv projection, one block per token row.
//   qkv  [rows, (H + 2K) * hd] fp32 (the matrix product's output, q heads, then k, then v)
//   bias [(H + 2K) * hd] engine dtype, or null
//   x    = round(qkv + bias): the projection's output as the engine stores it
//   q    [rows, H * hd] engine dtype: round(rope(x_q))
//   k, v go straight into the KV cache of one layer, [slots, 2, K, max_seq, hd], at
//   (slots[r], positions[r]): round(rope(x_k)), x_v.
// RoPE in HF's rotate-half form with fp32 cos/sin tables [max_seq, hd/2]:
//   x'[i] = x[i] cos - x[i + hd/2] sin,  x'[i + hd/2] = x[i + hd/2] cos + x[i] sin.
#include "dtype.cuh"
#include "rope.cuh"

template <class D>
__global__ void rope_qkv(const float* __restrict__ qkv, const typename D::T* __restrict__ bias,
                         const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                         const int* __restrict__ positions, const int* __restrict__ slots,
                         typename D::T* __restrict__ q_out, typename D::T* __restrict__ cache,
                         int num_heads, int num_kv_heads, int head_dim, int max_seq) {
    pdl_begin();
    const int r = blockIdx.x;
    const int half = head_dim >> 1;
    const int width = (num_heads + 2 * num_kv_heads) * head_dim;
    const int pos = positions[r];
    const long long slot = slots[r];
    const float* x = qkv + (long long)r * width;
    const int npairs = (num_heads + 2 * num_kv_heads) * half;
    for (int p = threadIdx.x; p < npairs; p += blockDim.x) {
        const int head = p / half, i = p - head * half;  // head over q, k, v heads in turn
        const int c0 = head * head_dim + i, c1 = c0 + half;
        float a = x[c0], b = x[c1];
        bias_round<D>(a, b, bias, c0, c1);
        if (head < num_heads + num_kv_heads)
            rotate_pair(a, b, cos_table[(long long)pos * half + i], sin_table[(long long)pos * half + i]);
        if (head < num_heads) {
            typename D::T* dst = q_out + (long long)r * num_heads * head_dim + head * head_dim;
            dst[i] = D::store(a);
            dst[i + half] = D::store(b);
        } else {
            const int kv = head < num_heads + num_kv_heads ? 0 : 1;  // 0: k, 1: v
            const int kvh = head - num_heads - kv * num_kv_heads;
            typename D::T* dst = cache + (((slot * 2 + kv) * num_kv_heads + kvh) * (long long)max_seq + pos)
                                 * head_dim;
            dst[i] = D::store(a);
            dst[i + half] = D::store(b);
        }
    }
}
