// fp32 -> fp16 / bf16 bits, round-to-nearest-even, NaN as NumPy keeps it: the sync's rounding
// (convert.cu), which the sync telemetry (telemetry.cu) repeats to count and checksum what the
// engine will hold. Bit for bit as ratchet.model.dtypes.round_to.
#pragma once
#include "dtype.cuh"

__device__ __forceinline__ unsigned short f32_to_f16_bits(float f) {
    const unsigned int b = __float_as_uint(f);
    if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0) {  // NaN as NumPy keeps it
        unsigned short h = (unsigned short)(0x7c00u + ((b & 0x007fffffu) >> 13));
        if (h == 0x7c00u) ++h;
        return (unsigned short)(((b >> 16) & 0x8000u) | h);
    }
    return F16::store(f);
}

__device__ __forceinline__ unsigned short f32_to_bf16_bits(float f) {
    const unsigned int b = __float_as_uint(f);
    if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0) return 0x7fc0u;
    return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

template <int BF16_OUT>
__device__ __forceinline__ unsigned short to_bits(float f) {
    return BF16_OUT ? f32_to_bf16_bits(f) : f32_to_f16_bits(f);
}
