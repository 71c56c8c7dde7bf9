// SwiGLU: out[r, j] = round(silu(gate[r, j]) * up[r, j]) with gate_up[r] = [gate (F) | up (F)],
// silu(g) = g / (1 + exp(-g)) in fp32.
#include "dtype.cuh"

template <class D>
__global__ void swiglu(const typename D::T* __restrict__ gate_up, typename D::T* __restrict__ out,
                       int rows, int inter) {
    const long long n = (long long)rows * inter;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / inter, j = i - r * inter;
        const float g = D::load(gate_up[r * 2 * inter + j]);
        const float u = D::load(gate_up[r * 2 * inter + inter + j]);
        out[i] = D::store(g / (1.0f + expf(-g)) * u);
    }
}
