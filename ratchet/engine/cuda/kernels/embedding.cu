// Token embedding: out[r, :] = table[tokens[r], :]. A copy, so exact in every dtype.
// A decode step may feed rows from the previous step on the GPU: where feed[r] > 0, row r's
// token is prev[feed[r] - 1], the token the previous step's sampler drew at that row (the host
// launches the step before it has read those tokens back).
#include "dtype.cuh"

template <class D>
__global__ void embedding(const int* __restrict__ tokens, const int* __restrict__ feed, const int* __restrict__ prev,
                          const typename D::T* __restrict__ table, typename D::T* __restrict__ out, int dim, int vocab) {
    pdl_begin();
    const int r = blockIdx.x;
    const int from = feed != nullptr ? feed[r] : 0;
    int tok = from > 0 ? prev[from - 1] : tokens[r];
    tok = tok < 0 ? 0 : (tok >= vocab ? vocab - 1 : tok);  // the host checks; never read outside
    const typename D::T* src = table + (long long)tok * dim;
    typename D::T* dst = out + (long long)r * dim;
    if ((dim * sizeof(typename D::T)) % 16 == 0) {
        const int nvec = dim * sizeof(typename D::T) / 16;
        const uint4* s = reinterpret_cast<const uint4*>(src);
        uint4* d = reinterpret_cast<uint4*>(dst);
        for (int i = threadIdx.x; i < nvec; i += blockDim.x) d[i] = s[i];
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
    }
}
