// Token embedding: out[r, :] = table[tokens[r], :]. A copy, so exact in every dtype.
#include "dtype.cuh"

template <class D>
__global__ void embedding(const int* __restrict__ tokens, const typename D::T* __restrict__ table,
                          typename D::T* __restrict__ out, int dim, int vocab) {
    const int r = blockIdx.x;
    int tok = tokens[r];
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
