// SiLU-gated product of SwiGLU in fp32, shared by swiglu.cu and swiglu_down.cu so both round
// the same value: silu(g) * u = g / (1 + exp(-g)) * u (IEEE division, accurate exp; the files
// that include it build with --fmad=false).
#pragma once

__device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}
