// 16-byte vectors of any element type and fp32 conversions: the memory-bound kernels load and store through these.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fusepack {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// kN elements of T in one 16-byte access.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

template <typename T>
__device__ __forceinline__ Vec16<T> load16(T const* p) {
  Vec16<T> r;
  *reinterpret_cast<int4*>(&r) = __ldg(reinterpret_cast<int4 const*>(p));
  return r;
}
template <typename T>
__device__ __forceinline__ void store16(T* p, Vec16<T> const& r) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<int4 const*>(&r);
}

inline bool aligned16(void const* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + __expf(-x)); }

}  // namespace fusepack
