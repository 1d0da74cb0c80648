#include "kernels/attention/attention.h"
#include "kernels/common/elementwise.cuh"

namespace fusepack {

// y = o · σ(gate)
struct AttentionGateFwd {
  static constexpr int kIn = 2, kOut = 1;
  __device__ void operator()(float const* in, float* out) const { out[0] = in[0] * sigmoidf_(in[1]); }
};

void run_attention_gate_fwd(AttentionGateFwdParams const& p, cudaStream_t stream) {
  run_elementwise(ElementwiseArgs<2, 1>{{p.o, p.gate}, {p.y}, p.n}, p.dtype, AttentionGateFwd{}, stream);
}

}  // namespace fusepack
