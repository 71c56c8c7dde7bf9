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

// The same, one warp per row (4 rows a block of 128 threads), for rows that fit in the
// registers of a warp: dim % (16 / sizeof(T)) == 0 and dim <= 32 * RMS_VPL * (16 / sizeof(T)).
// Every load (residual, delta, weight) is issued before any use, 16 bytes at a time, and the
// only reduction is a warp's shuffle: no shared memory, no block barrier.
#define RMS_VPL 4  // 16-byte vectors per lane: 1024 values of a 16-bit type, 512 of fp32

template <class D>
__global__ void __launch_bounds__(128)
add_rmsnorm_warp(typename D::T* __restrict__ residual, const typename D::T* __restrict__ delta,
                 const typename D::T* __restrict__ weight, typename D::T* __restrict__ out, int rows, int dim,
                 float eps) {
    constexpr int NV = Vec16<D>::N;
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int nvec = dim / NV;
    uint4* res = reinterpret_cast<uint4*>(residual + (long long)r * dim);
    const uint4* del = reinterpret_cast<const uint4*>(delta + (long long)r * dim);
    const uint4* w4 = reinterpret_cast<const uint4*>(weight);
    uint4 xv[RMS_VPL], dv[RMS_VPL], wv[RMS_VPL];
#pragma unroll
    for (int i = 0; i < RMS_VPL; ++i) {
        const int k = lane + 32 * i;
        if (k < nvec) {
            xv[i] = res[k];
            if (delta != nullptr) dv[i] = del[k];
            wv[i] = w4[k];
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < RMS_VPL; ++i) {
        const int k = lane + 32 * i;
        if (k < nvec) {
            float x[NV];
            unpack16<D>(xv[i], x);
            if (delta != nullptr) {
                float d[NV];
                unpack16<D>(dv[i], d);
#pragma unroll
                for (int j = 0; j < NV; ++j) x[j] += d[j];
                xv[i] = pack16<D>(x);  // rounded to the storage
                res[k] = xv[i];
                unpack16<D>(xv[i], x);
            }
#pragma unroll
            for (int j = 0; j < NV; ++j) ss += x[j] * x[j];
        }
    }
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    uint4* o = reinterpret_cast<uint4*>(out + (long long)r * dim);
#pragma unroll
    for (int i = 0; i < RMS_VPL; ++i) {
        const int k = lane + 32 * i;
        if (k < nvec) {
            float x[NV], w[NV];
            unpack16<D>(xv[i], x);
            unpack16<D>(wv[i], w);
#pragma unroll
            for (int j = 0; j < NV; ++j) x[j] = x[j] * inv * w[j];
            o[k] = pack16<D>(x);
        }
    }
}
