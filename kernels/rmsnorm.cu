// Fused residual add + RMSNorm, one block per row, fp32 arithmetic:
//   residual = round(residual + delta)          (only when `delta` is given)
//   out      = round(residual / sqrt(mean(residual^2) + eps) * weight)
// The sum runs over the rounded residual, as the NumPy backend does.
#include "dtype.cuh"

template <class D>
__global__ void add_rmsnorm(typename D::T* __restrict__ residual, const typename D::T* __restrict__ delta,
                            const typename D::T* __restrict__ weight, typename D::T* __restrict__ out,
                            int dim, float eps) {
    extern __shared__ float row[];  // [dim]
    __shared__ float partial[32];
    const long long base = (long long)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float x = D::load(residual[base + i]);
        if (delta != nullptr) {
            typename D::T r = D::store(x + D::load(delta[base + i]));
            residual[base + i] = r;
            x = D::load(r);
        }
        row[i] = x;
        ss += x * x;
    }
    ss = warp_sum(ss);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        const int nwarps = (blockDim.x + 31) >> 5;
        float t = lane < nwarps ? partial[lane] : 0.f;
        t = warp_sum(t);
        if (lane == 0) partial[0] = t;
    }
    __syncthreads();
    const float inv = 1.0f / sqrtf(partial[0] / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[base + i] = D::store(row[i] * inv * D::load(weight[i]));
}
