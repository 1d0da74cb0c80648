#include "kernels/common/elementwise.cuh"
#include "kernels/swiglu/swiglu.h"

namespace fusepack {

// dgate = dy · up · σ(g)(1 + g(1 − σ(g))), dup = dy · silu(g).
struct SwiGluBwd {
  static constexpr int kIn = 3, kOut = 2;
  __device__ void operator()(float const* in, float* out) const {
    float const g = in[0], u = in[1], d = in[2];
    float const s = sigmoidf_(g);
    out[0] = d * u * s * (1.0f + g * (1.0f - s));
    out[1] = d * g * s;
  }
};

void run_swiglu_bwd(SwiGluBwdParams const& p, cudaStream_t stream) {
  run_elementwise(ElementwiseArgs<3, 2>{{p.gate, p.up, p.dy}, {p.dgate, p.dup}, p.n}, p.dtype, SwiGluBwd{}, stream);
}

}  // namespace fusepack
