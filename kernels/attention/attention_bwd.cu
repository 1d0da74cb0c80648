#include "kernels/attention/attention.h"
#include "kernels/common/elementwise.cuh"

namespace fusepack {

// d_o = dy · σ(g) (FlashAttention's backward takes it as grad_out) and dgate = dy · o · σ(g) · σ(−g). σ(−g) is
// computed from its own exponential rather than as 1 − σ(g), which cancels to 0 for g ≳ 17 in fp32.
struct AttentionGateBwd {
  static constexpr int kIn = 3, kOut = 2;
  __device__ void operator()(float const* in, float* out) const {
    float const o = in[0], g = in[1], d = in[2];
    float const s = sigmoidf_(g), s_neg = sigmoidf_(-g);
    out[0] = d * s;
    out[1] = d * o * s * s_neg;
  }
};

void run_attention_gate_bwd(AttentionGateBwdParams const& p, cudaStream_t stream) {
  run_elementwise(ElementwiseArgs<3, 2>{{p.o, p.gate, p.dy}, {p.d_o, p.dgate}, p.n}, p.dtype, AttentionGateBwd{},
                  stream);
}

}  // namespace fusepack
