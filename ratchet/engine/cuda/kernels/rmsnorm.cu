// Fused residual add + RMSNorm, one block per row, fp32 arithmetic:
//   residual = round(residual + delta)          (only when a delta is given)
//   out      = round(residual / sqrt(mean(residual^2) + eps) * weight)
// The sum runs over the rounded residual, as the NumPy backend does.
//
// The delta is either `delta` (a product's output in the storage type) or the product itself
// as `nparts` fp32 slices [nparts, rows, dim] of a split-K product (ops.gemm_split): they are
// summed in slice order and rounded to the storage, the value the product would have stored,
// so the split's reduction costs no kernel of its own.
#include "dtype.cuh"

template <class D>
__global__ void add_rmsnorm(typename D::T* __restrict__ residual, const typename D::T* __restrict__ delta,
                            const float* __restrict__ parts, int nparts, const typename D::T* __restrict__ weight,
                            typename D::T* __restrict__ out, int dim, float eps) {
    pdl_begin();
    extern __shared__ float row[];  // [dim]
    __shared__ float partial[32];
    const long long base = (long long)blockIdx.x * dim;
    const long long part_stride = (long long)gridDim.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float x = D::load(residual[base + i]);
        if (delta != nullptr || nparts > 0) {
            float d;
            if (nparts > 0) {
                d = parts[base + i];
                for (int p = 1; p < nparts; ++p) d += parts[p * part_stride + base + i];
                d = D::load(D::store(d));
            } else {
                d = D::load(delta[base + i]);
            }
            typename D::T r = D::store(x + d);
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

// A vector's P fp32 slices summed in slice order, rounded to the storage: the split product's output.
template <class D, int P, int F4>
__device__ __forceinline__ uint4 slice_sum(const float4 (&slices)[P][F4]) {
    float d[4 * F4];
#pragma unroll
    for (int f = 0; f < F4; ++f) {
        float4 s = slices[0][f];
#pragma unroll
        for (int p = 1; p < P; ++p) {
            s.x += slices[p][f].x; s.y += slices[p][f].y;
            s.z += slices[p][f].z; s.w += slices[p][f].w;
        }
        d[4 * f] = s.x; d[4 * f + 1] = s.y; d[4 * f + 2] = s.z; d[4 * f + 3] = s.w;
    }
    return pack16<D>(d);
}

// add_rmsnorm's arithmetic, one warp per row (blockDim.x / 32 rows a block), for rows that fit in the
// registers of a warp: dim % (16 / sizeof(T)) == 0 and dim <= 32 * RMS_VPL * (16 / sizeof(T)).
// Every load (residual, delta or the P slices, weight) is issued before any use, 16 bytes at a
// time, and the only reduction is a warp's shuffle: no shared memory, no block barrier.
// P = 0: `delta` (or none); P > 0: the delta is the in-order sum of P fp32 slices `parts`,
// rounded to the storage. Qwen2.5-0.5B's 896 (run 5's kernel, 168 registers).
#define RMS_VPL 4  // 16-byte vectors per lane: 1024 values of a 16-bit type, 512 of fp32

template <class D, int P>
__global__ void __launch_bounds__(128)
add_rmsnorm_warp(typename D::T* __restrict__ residual, const typename D::T* __restrict__ delta,
                 const float* __restrict__ parts, const typename D::T* __restrict__ weight,
                 typename D::T* __restrict__ out, int rows, int dim, float eps) {
    pdl_begin();
    constexpr int NV = Vec16<D>::N;
    constexpr int PV = P > 0 ? P : 1;  // slices held (one unused when P == 0)
    constexpr int F4 = NV / 4;         // float4 loads of one slice a vector
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int nvec = dim / NV;
    const bool add = P > 0 || delta != nullptr;
    uint4* res = reinterpret_cast<uint4*>(residual + (long long)r * dim);
    const uint4* del = reinterpret_cast<const uint4*>(delta + (long long)r * dim);
    const float4* part = reinterpret_cast<const float4*>(parts + (long long)r * dim);
    const long long part_stride = (long long)rows * dim / 4;  // float4s between slices
    const uint4* w4 = reinterpret_cast<const uint4*>(weight);
    uint4 xv[RMS_VPL], dv[RMS_VPL], wv[RMS_VPL];
    float4 pv[RMS_VPL][PV][F4];
#pragma unroll
    for (int i = 0; i < RMS_VPL; ++i) {
        const int k = lane + 32 * i;
        if (k < nvec) {
            xv[i] = res[k];
            if constexpr (P > 0) {
#pragma unroll
                for (int p = 0; p < PV; ++p)
#pragma unroll
                    for (int f = 0; f < F4; ++f) pv[i][p][f] = part[p * part_stride + (long long)k * F4 + f];
            } else if (delta != nullptr) {
                dv[i] = del[k];
            }
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
            if (add) {
                if constexpr (P > 0) dv[i] = slice_sum<D>(pv[i]);
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

// add_rmsnorm's arithmetic, a block per row and one 16-byte vector per thread, for rows past a
// warp's registers: dim % (16 / sizeof(T)) == 0 and dim / (16 / sizeof(T)) <= RMS_ROW_THREADS
// (Coder-1.5B's 1536: 192 threads; Qwen2.5-7B's 3584: 448). A thread issues all its loads at
// once (residual, delta or its P slices, weight: one round trip to memory), and the row's sum
// of squares is each warp's shuffle, then the warps' partials in warp order after one barrier.
// A warp a row in more vectors a lane ran 4.2 us a call at 1536 (64 rows: 64 warps on a
// 132-multiprocessor GPU, each waiting on its own loads in turn); the block kernel above,
// 2-byte loads in a loop, 8 us at 1536 and 17 us at 3584.
#define RMS_ROW_THREADS 512

template <class D, int P>
__global__ void __launch_bounds__(RMS_ROW_THREADS)
add_rmsnorm_row(typename D::T* __restrict__ residual, const typename D::T* __restrict__ delta,
                const float* __restrict__ parts, const typename D::T* __restrict__ weight,
                typename D::T* __restrict__ out, int rows, int dim, float eps) {
    pdl_begin();
    constexpr int NV = Vec16<D>::N;
    constexpr int PV = P > 0 ? P : 1;
    constexpr int F4 = NV / 4;
    __shared__ float partial[RMS_ROW_THREADS / 32];
    const int r = blockIdx.x, k = threadIdx.x;
    const bool mine = k < dim / NV;  // this thread's vector is in the row
    const long long base = (long long)r * dim;
    uint4* res = reinterpret_cast<uint4*>(residual + base);
    uint4 xv, wv;
    float ss = 0.f;
    if (mine) {
        xv = res[k];
        wv = reinterpret_cast<const uint4*>(weight)[k];
        bool add = delta != nullptr;
        uint4 dv;
        if constexpr (P > 0) {
            const float4* part = reinterpret_cast<const float4*>(parts + base);
            const long long part_stride = (long long)rows * dim / 4;  // float4s between slices
            float4 slices[PV][F4];
#pragma unroll
            for (int p = 0; p < PV; ++p)
#pragma unroll
                for (int f = 0; f < F4; ++f) slices[p][f] = part[p * part_stride + (long long)k * F4 + f];
            dv = slice_sum<D>(slices);
            add = true;
        } else if (add) {
            dv = reinterpret_cast<const uint4*>(delta + base)[k];
        }
        float x[NV];
        unpack16<D>(xv, x);
        if (add) {
            float d[NV];
            unpack16<D>(dv, d);
#pragma unroll
            for (int j = 0; j < NV; ++j) x[j] += d[j];
            xv = pack16<D>(x);  // rounded to the storage
            res[k] = xv;
            unpack16<D>(xv, x);
        }
#pragma unroll
        for (int j = 0; j < NV; ++j) ss += x[j] * x[j];
    }
    ss = warp_sum(ss);
    if ((k & 31) == 0) partial[k >> 5] = ss;
    __syncthreads();
    float total = 0.f;  // every thread sums the partials in warp order (broadcast reads): one barrier
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += partial[w];
    const float inv = 1.0f / sqrtf(total / (float)dim + eps);
    if (mine) {
        float x[NV], w[NV];
        unpack16<D>(xv, x);
        unpack16<D>(wv, w);
#pragma unroll
        for (int j = 0; j < NV; ++j) x[j] = x[j] * inv * w[j];
        reinterpret_cast<uint4*>(out + base)[k] = pack16<D>(x);
    }
}
