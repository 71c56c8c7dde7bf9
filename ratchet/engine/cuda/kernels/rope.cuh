// RoPE's arithmetic on one dim pair (i, i + hd/2), shared by rope.cu and the fused decode
// attention (attention_decode.cu) so that both store the same bits. Every operation is an
// explicit round-to-nearest one: no contraction into FMAs, whatever --fmad the including file
// is built with.
#pragma once
#include "dtype.cuh"

// x = round(qkv + bias) on both values of the pair (bias may be null)
template <class D>
__device__ __forceinline__ void bias_round(float& a, float& b, const typename D::T* bias, int c0, int c1) {
    if (bias != nullptr) {
        a = __fadd_rn(a, D::load(bias[c0]));
        b = __fadd_rn(b, D::load(bias[c1]));
    }
    a = D::load(D::store(a));
    b = D::load(D::store(b));
}

// HF's rotate-half form: a' = a cos - b sin, b' = b cos + a sin
__device__ __forceinline__ void rotate_pair(float& a, float& b, float c, float s) {
    const float a2 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    const float b2 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    a = a2;
    b = b2;
}
