// One launcher for the memory-bound elementwise kernels (swiglu, the attention output gate, forward and backward):
// kIn inputs and kOut outputs of one dtype, n elements each, contiguous. One thread per 16-byte vector when every
// pointer is 16-byte aligned, one per element otherwise, grid-stride. The per-element formula is a functor
//   struct F { static constexpr int kIn = 2, kOut = 1; __device__ void operator()(float const* in, float* out) const; }
// computed in fp32 and rounded once per output; each element is independent, so the results are bitwise
// deterministic.
#pragma once

#include "kernels/common/cuda_check.h"
#include "kernels/common/dtype.h"
#include "kernels/common/static_switch.h"
#include "kernels/common/vec.cuh"

#include <algorithm>
#include <cstdint>

namespace fusepack {

template <int kIn, int kOut>
struct ElementwiseArgs {
  void const* in[kIn];  // [n] each
  void* out[kOut];      // [n] each
  std::int64_t n = 0;
};

template <typename T, bool kVec, typename F>
__global__ void elementwise_apply(ElementwiseArgs<F::kIn, F::kOut> a, F f) {
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x * kN;
  for (std::int64_t i = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kN; i < a.n; i += stride) {
    if constexpr (kVec) {
      if (i + kN <= a.n) {
        Vec16<T> in[F::kIn], out[F::kOut];
#pragma unroll
        for (int k = 0; k < F::kIn; ++k) in[k] = load16(static_cast<T const*>(a.in[k]) + i);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float x[F::kIn], y[F::kOut];
#pragma unroll
          for (int k = 0; k < F::kIn; ++k) x[k] = to_float(in[k].v[j]);
          f(x, y);
#pragma unroll
          for (int k = 0; k < F::kOut; ++k) out[k].v[j] = from_float<T>(y[k]);
        }
#pragma unroll
        for (int k = 0; k < F::kOut; ++k) store16(static_cast<T*>(a.out[k]) + i, out[k]);
        continue;
      }
    }
    for (std::int64_t e = i; e < i + kN && e < a.n; ++e) {
      float x[F::kIn], y[F::kOut];
#pragma unroll
      for (int k = 0; k < F::kIn; ++k) x[k] = to_float(static_cast<T const*>(a.in[k])[e]);
      f(x, y);
#pragma unroll
      for (int k = 0; k < F::kOut; ++k) static_cast<T*>(a.out[k])[e] = from_float<T>(y[k]);
    }
  }
}

template <typename F>
void run_elementwise(ElementwiseArgs<F::kIn, F::kOut> const& a, DType dtype, F f, cudaStream_t stream) {
  if (a.n == 0) return;
  bool vec = true;
  for (void const* p : a.in) vec = vec && aligned16(p);
  for (void const* p : a.out) vec = vec && aligned16(p);
  FUSEPACK_DTYPE_SWITCH(dtype, T, [&] {
    FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
      constexpr int kThreads = 256, kN = kVec ? Vec16<T>::kN : 1;
      std::int64_t const blocks = std::min<std::int64_t>((a.n + kThreads * kN - 1) / (kThreads * kN), 1 << 16);
      elementwise_apply<T, kVec, F><<<static_cast<int>(blocks), kThreads, 0, stream>>>(a, f);
      FUSEPACK_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace fusepack
