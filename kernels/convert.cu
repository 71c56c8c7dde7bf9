// fp32 -> engine dtype, round-to-nearest-even, bit for bit as ratchet.model.dtypes.round_to
// (and torch's .to(dtype)) give it, NaN included. For in-place weight sync: the source is a
// torch fp32 tensor seen through DLPack, the destination an engine weight buffer.
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
__global__ void convert_f32(const float* __restrict__ src, unsigned short* __restrict__ dst, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long nvec = n / 4;
    const bool aligned = (reinterpret_cast<size_t>(src) & 15) == 0 && (reinterpret_cast<size_t>(dst) & 7) == 0;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (aligned) {
        for (; i < nvec; i += stride) {
            const float4 f = reinterpret_cast<const float4*>(src)[i];
            ushort4 o;
            o.x = BF16_OUT ? f32_to_bf16_bits(f.x) : f32_to_f16_bits(f.x);
            o.y = BF16_OUT ? f32_to_bf16_bits(f.y) : f32_to_f16_bits(f.y);
            o.z = BF16_OUT ? f32_to_bf16_bits(f.z) : f32_to_f16_bits(f.z);
            o.w = BF16_OUT ? f32_to_bf16_bits(f.w) : f32_to_f16_bits(f.w);
            reinterpret_cast<ushort4*>(dst)[i] = o;
        }
        i = nvec * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    }
    for (; i < n; i += stride) dst[i] = BF16_OUT ? f32_to_bf16_bits(src[i]) : f32_to_f16_bits(src[i]);
}
