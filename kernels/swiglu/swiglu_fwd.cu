#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/common/vec.cuh"
#include "kernels/swiglu/swiglu.h"

namespace fusepack {

// One thread per 16-byte vector when every pointer is 16-byte aligned, one per element otherwise.
template <typename T, bool kVec>
__global__ void swiglu_fwd_elementwise(SwiGluFwdParams p) {
  auto const* gate = static_cast<T const*>(p.gate);
  auto const* up = static_cast<T const*>(p.up);
  auto* y = static_cast<T*>(p.y);
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x * kN;
  for (std::int64_t i = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kN; i < p.n; i += stride) {
    if constexpr (kVec) {
      if (i + kN <= p.n) {
        Vec16<T> const g = load16(gate + i), u = load16(up + i);
        Vec16<T> out;
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float const gf = to_float(g.v[j]);
          out.v[j] = from_float<T>(gf * sigmoidf_(gf) * to_float(u.v[j]));
        }
        store16(y + i, out);
        continue;
      }
    }
    for (std::int64_t e = i; e < i + kN && e < p.n; ++e) {
      float const gf = to_float(gate[e]);
      y[e] = from_float<T>(gf * sigmoidf_(gf) * to_float(up[e]));
    }
  }
}

void run_swiglu_fwd(SwiGluFwdParams const& p, cudaStream_t stream) {
  if (p.n == 0) return;
  bool const vec = aligned16(p.gate) && aligned16(p.up) && aligned16(p.y);
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
      constexpr int kThreads = 256, kN = kVec ? Vec16<T>::kN : 1;
      std::int64_t const blocks = std::min<std::int64_t>((p.n + kThreads * kN - 1) / (kThreads * kN), 1 << 16);
      swiglu_fwd_elementwise<T, kVec><<<static_cast<int>(blocks), kThreads, 0, stream>>>(p);
      FUSEPACK_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace fusepack
