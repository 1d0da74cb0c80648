#include "kernels/attention/attention.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/common/vec.cuh"

namespace fusepack {

// One thread per 16-byte vector when every pointer is 16-byte aligned, one per element otherwise.
template <typename T, bool kVec>
__global__ void attention_gate_fwd_elementwise(AttentionGateFwdParams p) {
  auto const* o = static_cast<T const*>(p.o);
  auto const* gate = static_cast<T const*>(p.gate);
  auto* y = static_cast<T*>(p.y);
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x * kN;
  for (std::int64_t i = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kN; i < p.n; i += stride) {
    if constexpr (kVec) {
      if (i + kN <= p.n) {
        Vec16<T> const ov = load16(o + i), gv = load16(gate + i);
        Vec16<T> out;
#pragma unroll
        for (int j = 0; j < kN; ++j) out.v[j] = from_float<T>(to_float(ov.v[j]) * sigmoidf_(to_float(gv.v[j])));
        store16(y + i, out);
        continue;
      }
    }
    for (std::int64_t e = i; e < i + kN && e < p.n; ++e) {
      y[e] = from_float<T>(to_float(o[e]) * sigmoidf_(to_float(gate[e])));
    }
  }
}

void run_attention_gate_fwd(AttentionGateFwdParams const& p, cudaStream_t stream) {
  if (p.n == 0) return;
  bool const vec = aligned16(p.o) && aligned16(p.gate) && aligned16(p.y);
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
      constexpr int kThreads = 256, kN = kVec ? Vec16<T>::kN : 1;
      std::int64_t const blocks = std::min<std::int64_t>((p.n + kThreads * kN - 1) / (kThreads * kN), 1 << 16);
      attention_gate_fwd_elementwise<T, kVec><<<static_cast<int>(blocks), kThreads, 0, stream>>>(p);
      FUSEPACK_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace fusepack
