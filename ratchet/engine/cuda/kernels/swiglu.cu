// SwiGLU: out[r, j] = round(silu(gate[r, j]) * up[r, j]) with gate_up[r] = [gate (F) | up (F)],
// silu(g) = g / (1 + exp(-g)) in fp32.
#include "dtype.cuh"

template <class D>
__device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

template <class D>
__global__ void swiglu(const typename D::T* __restrict__ gate_up, typename D::T* __restrict__ out,
                       int rows, int inter) {
    pdl_begin();
    const long long n = (long long)rows * inter;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / inter, j = i - r * inter;
        const float g = D::load(gate_up[r * 2 * inter + j]);
        const float u = D::load(gate_up[r * 2 * inter + inter + j]);
        out[i] = D::store(silu_mul<D>(g, u));
    }
}

// The same, 16 bytes of outputs a thread per step (needs inter % (16 / sizeof(T)) == 0).
template <class D>
__global__ void swiglu_vec(const typename D::T* __restrict__ gate_up, typename D::T* __restrict__ out,
                           int rows, int inter) {
    pdl_begin();
    constexpr int NV = Vec16<D>::N;
    const int iv = inter / NV;  // vectors per row of out
    const long long n = (long long)rows * iv;
    const uint4* gu = reinterpret_cast<const uint4*>(gate_up);
    uint4* o = reinterpret_cast<uint4*>(out);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / iv, j = i - r * iv;
        const uint4 gv = gu[r * 2 * iv + j], uv = gu[r * 2 * iv + iv + j];
        float g[NV], u[NV];
        unpack16<D>(gv, g);
        unpack16<D>(uv, u);
#pragma unroll
        for (int k = 0; k < NV; ++k) g[k] = silu_mul<D>(g[k], u[k]);
        o[i] = pack16<D>(g);
    }
}
