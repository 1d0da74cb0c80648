#include "kernels/common/elementwise.cuh"
#include "kernels/swiglu/swiglu.h"

namespace fusepack {

// y = silu(gate) · up
struct SwiGluFwd {
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(float const* in, float* out) const {
    float const g = in[0];
    out[0] = g * sigmoidf_(g) * in[1];
  }
};

void run_swiglu_fwd(SwiGluFwdParams const& p, cudaStream_t stream) {
  run_elementwise(ElementwiseArgs<2, 1>{{p.gate, p.up}, {p.y}, p.n}, p.dtype, SwiGluFwd{}, stream);
}

}  // namespace fusepack
