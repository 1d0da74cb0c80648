#include "kernels/attention/attention.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/common/vec.cuh"

namespace fusepack {

// d_o = dy · σ(g) (FlashAttention's backward takes it as grad_out) and dgate = dy · o · σ(g) · σ(−g). σ(−g) is
// computed from its own exponential rather than as 1 − σ(g), which cancels to 0 for g ≳ 17 in fp32. Each element is
// independent, so the backward is bitwise deterministic.
template <typename T>
__device__ __forceinline__ void attention_gate_grad(T o, T g, T dy, T& d_o, T& dgate) {
  float const of = to_float(o), gf = to_float(g), d = to_float(dy);
  float const s = sigmoidf_(gf), s_neg = sigmoidf_(-gf);
  d_o = from_float<T>(d * s);
  dgate = from_float<T>(d * of * s * s_neg);
}

template <typename T, bool kVec>
__global__ void attention_gate_bwd_elementwise(AttentionGateBwdParams p) {
  auto const* o = static_cast<T const*>(p.o);
  auto const* gate = static_cast<T const*>(p.gate);
  auto const* dy = static_cast<T const*>(p.dy);
  auto* d_o = static_cast<T*>(p.d_o);
  auto* dgate = static_cast<T*>(p.dgate);
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x * kN;
  for (std::int64_t i = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kN; i < p.n; i += stride) {
    if constexpr (kVec) {
      if (i + kN <= p.n) {
        Vec16<T> const ov = load16(o + i), gv = load16(gate + i), dv = load16(dy + i);
        Vec16<T> dov, dgv;
#pragma unroll
        for (int j = 0; j < kN; ++j) attention_gate_grad(ov.v[j], gv.v[j], dv.v[j], dov.v[j], dgv.v[j]);
        store16(d_o + i, dov);
        store16(dgate + i, dgv);
        continue;
      }
    }
    for (std::int64_t e = i; e < i + kN && e < p.n; ++e) attention_gate_grad(o[e], gate[e], dy[e], d_o[e], dgate[e]);
  }
}

void run_attention_gate_bwd(AttentionGateBwdParams const& p, cudaStream_t stream) {
  if (p.n == 0) return;
  bool const vec = aligned16(p.o) && aligned16(p.gate) && aligned16(p.dy) && aligned16(p.d_o) && aligned16(p.dgate);
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
      constexpr int kThreads = 256, kN = kVec ? Vec16<T>::kN : 1;
      std::int64_t const blocks = std::min<std::int64_t>((p.n + kThreads * kN - 1) / (kThreads * kN), 1 << 16);
      attention_gate_bwd_elementwise<T, kVec><<<static_cast<int>(blocks), kThreads, 0, stream>>>(p);
      FUSEPACK_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace fusepack
