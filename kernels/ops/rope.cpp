#include "kernels/ops/rope.h"

#include "kernels/ops/check.h"
#include "kernels/ops/op_scope.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

#ifdef FUSEPACK_WITH_CUDA_KERNELS
#include "kernels/ops/dtype.h"
#include "kernels/rope/rope.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fusepack::ops {

namespace {

// The fused kernel keeps a [tokens, rotary_dim/2] cos/sin table in 48 KB of shared memory: one token needs
// 4·rotary_dim bytes.
constexpr int64_t kMaxFusedRotaryDim = 12288;

// HF transformers' rotary embedding (Qwen3.5 text: 1-D positions), as users run it without fused kernels.
at::Tensor rope_composite(at::Tensor const& x, at::Tensor const& position_ids, int64_t rotary_dim, double theta) {
  FUSEPACK_OP_RUNS("rope", Pass::kForward, Backend::kComposite);
  int64_t const D = x.size(2), half = rotary_dim / 2;
  at::ScalarType const ct = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;  // HF: fp32
  at::Tensor const exponent = at::arange(0, rotary_dim, 2, x.options().dtype(at::kLong)).to(ct) / double(rotary_dim);
  at::Tensor const inv_freq = at::reciprocal(at::pow(theta, exponent));               // [r/2]
  at::Tensor const freqs = position_ids.to(ct).unsqueeze(1) * inv_freq.unsqueeze(0);  // [T, r/2]
  at::Tensor const emb = at::cat({freqs, freqs}, -1);                                 // [T, r]
  at::Tensor const cos = emb.cos().to(x.scalar_type()).unsqueeze(1), sin = emb.sin().to(x.scalar_type()).unsqueeze(1);
  at::Tensor const x_rot = x.narrow(2, 0, rotary_dim);
  at::Tensor const rotate_half = at::cat({-x_rot.narrow(2, half, half), x_rot.narrow(2, 0, half)}, -1);
  at::Tensor const y_rot = x_rot * cos + rotate_half * sin;
  return rotary_dim == D ? y_rot : at::cat({y_rot, x.narrow(2, rotary_dim, D - rotary_dim)}, -1);
}

#ifdef FUSEPACK_WITH_CUDA_KERNELS
template <typename Params>
void fill_dims(Params& p, at::Tensor const& t, at::Tensor const& position_ids, int64_t rotary_dim, double theta) {
  p.position_ids = position_ids.data_ptr<int64_t>();
  p.T = t.size(0);
  p.H = t.size(1);
  p.D = t.size(2);
  p.rotary_dim = rotary_dim;
  p.theta = theta;
  p.dtype = kernel_dtype(t);
}

struct RopeFunction : torch::autograd::Function<RopeFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor const& x, at::Tensor const& position_ids,
                            int64_t rotary_dim, double theta) {
    FUSEPACK_OP_RUNS("rope", Pass::kForward, Backend::kFused);
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor y = at::empty_like(x);
    RopeFwdParams p;
    fill_dims(p, x, position_ids, rotary_dim, theta);
    p.x = x.data_ptr();
    p.y = y.data_ptr();
    run_rope_fwd(p, at::cuda::getCurrentCUDAStream());
    ctx->save_for_backward({position_ids});  // the backward needs no x: it rotates dy back
    ctx->saved_data["rotary_dim"] = rotary_dim;
    ctx->saved_data["theta"] = theta;
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    FUSEPACK_OP_RUNS("rope", Pass::kBackward, Backend::kFused);
    at::Tensor const position_ids = ctx->get_saved_variables()[0];
    at::Tensor const dy = grads[0].contiguous();
    c10::cuda::CUDAGuard guard(dy.device());
    at::Tensor dx = at::empty_like(dy);
    RopeBwdParams p;
    fill_dims(p, dy, position_ids, ctx->saved_data["rotary_dim"].toInt(), ctx->saved_data["theta"].toDouble());
    p.dy = dy.data_ptr();
    p.dx = dx.data_ptr();
    run_rope_bwd(p, at::cuda::getCurrentCUDAStream());
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
#endif

}  // namespace

at::Tensor rope(at::Tensor const& x, at::Tensor const& position_ids, int64_t rotary_dim, double theta,
                Backend backend) {
  check_sizes("rope", "x", x, {-1, -1, -1});
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "rope: x must be floating point; got ", x.scalar_type());
  int64_t const T = x.size(0), D = x.size(2);
  TORCH_CHECK(position_ids.defined(), "rope: position_ids is required but was not given");
  TORCH_CHECK(position_ids.scalar_type() == at::kLong, "rope: position_ids must be int64; got ",
              position_ids.scalar_type());
  TORCH_CHECK(position_ids.dim() == 1 && position_ids.size(0) == T, "rope: position_ids must have shape [T] = [", T,
              "] (T = x dimension 0, x has shape ", x.sizes(), "); got shape ", position_ids.sizes());
  TORCH_CHECK(position_ids.device() == x.device(), "rope: position_ids is on ", position_ids.device(), " but x is on ",
              x.device(), "; they must be on the same device");
  TORCH_CHECK(rotary_dim >= 2 && rotary_dim <= D, "rope: rotary_dim must be in 2..D = 2..", D,
              " (D = the head dim, x dimension 2, x has shape ", x.sizes(), "); got rotary_dim=", rotary_dim);
  TORCH_CHECK(rotary_dim % 2 == 0, "rope: rotary_dim must be even (NeoX half-split pairs i with i + rotary_dim/2); got",
              " rotary_dim=", rotary_dim);
  TORCH_CHECK(theta > 0 && std::isfinite(theta), "rope: theta must be positive and finite; got theta=", theta);
  if (backend == Backend::kComposite) return rope_composite(x, position_ids, rotary_dim, theta);
  check_fused_input("rope", "x", x);
  TORCH_CHECK(rotary_dim <= kMaxFusedRotaryDim, "rope: the fused kernel supports rotary_dim up to ", kMaxFusedRotaryDim,
              " (its cos/sin table lives in shared memory); got rotary_dim=", rotary_dim);
  TORCH_CHECK(x.size(1) * D <= std::numeric_limits<int32_t>::max(),
              "rope: the fused kernel indexes a token's H·D = ", x.size(1) * D,
              " elements with 32-bit integers; x has shape ", x.sizes());
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  return RopeFunction::apply(x, position_ids.contiguous(), rotary_dim, theta);
#else
  TORCH_CHECK(false, "rope: unreachable without CUDA kernels");
#endif
}

}  // namespace fusepack::ops
