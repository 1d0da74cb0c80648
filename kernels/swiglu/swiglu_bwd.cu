#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/common/vec.cuh"
#include "kernels/swiglu/swiglu.h"

namespace fusepack {

// dgate = dy · up · σ(g)(1 + g(1 − σ(g))), dup = dy · silu(g); each element independent, so the backward is
// bitwise deterministic.
template <typename T>
__device__ __forceinline__ void swiglu_grad(T g, T u, T dy, T& dg, T& du) {
  float const gf = to_float(g), uf = to_float(u), d = to_float(dy);
  float const s = sigmoidf_(gf);
  dg = from_float<T>(d * uf * s * (1.0f + gf * (1.0f - s)));
  du = from_float<T>(d * gf * s);
}

template <typename T, bool kVec>
__global__ void swiglu_bwd_elementwise(SwiGluBwdParams p) {
  auto const* gate = static_cast<T const*>(p.gate);
  auto const* up = static_cast<T const*>(p.up);
  auto const* dy = static_cast<T const*>(p.dy);
  auto* dgate = static_cast<T*>(p.dgate);
  auto* dup = static_cast<T*>(p.dup);
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x * kN;
  for (std::int64_t i = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kN; i < p.n; i += stride) {
    if constexpr (kVec) {
      if (i + kN <= p.n) {
        Vec16<T> const g = load16(gate + i), u = load16(up + i), d = load16(dy + i);
        Vec16<T> dg, du;
#pragma unroll
        for (int j = 0; j < kN; ++j) swiglu_grad(g.v[j], u.v[j], d.v[j], dg.v[j], du.v[j]);
        store16(dgate + i, dg);
        store16(dup + i, du);
        continue;
      }
    }
    for (std::int64_t e = i; e < i + kN && e < p.n; ++e) swiglu_grad(gate[e], up[e], dy[e], dgate[e], dup[e]);
  }
}

void run_swiglu_bwd(SwiGluBwdParams const& p, cudaStream_t stream) {
  if (p.n == 0) return;
  bool const vec = aligned16(p.gate) && aligned16(p.up) && aligned16(p.dy) && aligned16(p.dgate) && aligned16(p.dup);
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
      constexpr int kThreads = 256, kN = kVec ? Vec16<T>::kN : 1;
      std::int64_t const blocks = std::min<std::int64_t>((p.n + kThreads * kN - 1) / (kThreads * kN), 1 << 16);
      swiglu_bwd_elementwise<T, kVec><<<static_cast<int>(blocks), kThreads, 0, stream>>>(p);
      FUSEPACK_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace fusepack
