// Storage types of the engine: fp32, fp16, bf16. Shared by every kernel through `#include`.
//
// No <cuda_fp16.h>: NVRTC (CuPy) and nvcc both take this header as is. 16-bit values travel
// as `unsigned short` and convert through single PTX instructions, round-to-nearest-even,
// the rule torch's `.to(dtype)` and NumPy's `astype` follow.
#pragma once

#ifndef INFINITY  // NVRTC has no <math.h>
#define INFINITY __int_as_float(0x7f800000)
#endif

// Programmatic dependent launch (sm_90+; ratchet/engine/cuda/launch.py). Every kernel calls
// this first: launched with the PDL attribute, it may start while the previous kernel in the
// stream drains, so it waits here, before touching memory, until that kernel has completed
// and its writes are visible (griddepcontrol.wait), then lets the next kernel be scheduled.
// Launched normally (or before sm_90) both are no-ops.
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

struct F32 {
    typedef float T;
    static __device__ __forceinline__ float load(T x) { return x; }
    static __device__ __forceinline__ T store(float x) { return x; }
};

struct F16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float load(T x) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
        return f;
    }
    static __device__ __forceinline__ T store(float f) {
        T x;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));
        return x;
    }
};

struct BF16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float load(T x) {
        return __uint_as_float(((unsigned int)x) << 16);
    }
    static __device__ __forceinline__ T store(float f) {
        T x;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(x) : "f"(f));
        return x;
    }
};

// Eight 16-bit values in one 16-byte load, converted to fp32.
template <class D>
__device__ __forceinline__ void load8(const typename D::T* p, float* out) {
    uint4 v = *reinterpret_cast<const uint4*>(p);
    unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = D::load((typename D::T)(w[i] & 0xffffu));
        out[2 * i + 1] = D::load((typename D::T)(w[i] >> 16));
    }
}

template <>
__device__ __forceinline__ void load8<F32>(const float* p, float* out) {
    float4 a = *reinterpret_cast<const float4*>(p);
    float4 b = *reinterpret_cast<const float4*>(p + 4);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

// Two consecutive values (p 4-byte aligned for 16-bit types, 8-byte for fp32) in one load.
template <class D>
__device__ __forceinline__ void load2(const typename D::T* p, float& a, float& b) {
    const unsigned int w = *reinterpret_cast<const unsigned int*>(p);
    a = D::load((typename D::T)(w & 0xffffu));
    b = D::load((typename D::T)(w >> 16));
}

template <>
__device__ __forceinline__ void load2<F32>(const float* p, float& a, float& b) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    a = v.x;
    b = v.y;
}

// 16 bytes of values (8 of a 16-bit type, 4 fp32) to fp32 and back.
template <class D>
struct Vec16 {
    static constexpr int N = 16 / (int)sizeof(typename D::T);
};

template <class D>
__device__ __forceinline__ void unpack16(const uint4& v, float* out) {
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = D::load((typename D::T)(w[i] & 0xffffu));
        out[2 * i + 1] = D::load((typename D::T)(w[i] >> 16));
    }
}

template <>
__device__ __forceinline__ void unpack16<F32>(const uint4& v, float* out) {
    out[0] = __uint_as_float(v.x);
    out[1] = __uint_as_float(v.y);
    out[2] = __uint_as_float(v.z);
    out[3] = __uint_as_float(v.w);
}

template <class D>
__device__ __forceinline__ uint4 pack16(const float* in) {
    unsigned int w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        w[i] = (unsigned int)D::store(in[2 * i]) | ((unsigned int)D::store(in[2 * i + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <>
__device__ __forceinline__ uint4 pack16<F32>(const float* in) {
    return make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]),
                      __float_as_uint(in[3]));
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
