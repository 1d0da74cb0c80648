#include "kernels/ops/conv1d.h"

#include "kernels/conv1d/conv1d_widths.h"
#include "kernels/ops/check.h"
#include "kernels/ops/op_scope.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#ifdef FUSEPACK_WITH_CUDA_KERNELS
#include "kernels/conv1d/conv1d.h"
#include "kernels/ops/dtype.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fusepack::ops {

namespace {

// Per example: nn.Conv1d's functional form on [1, C, L] (groups = C), padding W−1 on the left by zeros (or by the
// example's initial state), keeping the first L outputs. Correct on packed input by construction.
at::Tensor conv1d_composite(at::Tensor const& x, at::Tensor const& weight, std::vector<int32_t> const& cu,
                            bool silu, at::Tensor const& initial_state) {
  FUSEPACK_OP_RUNS("conv1d", Pass::kForward, Backend::kComposite);
  int64_t const C = x.size(1), W = weight.size(1), pad = W - 1, N = static_cast<int64_t>(cu.size()) - 1;
  at::Tensor const w = weight.unsqueeze(1);  // [C, 1, W]
  std::vector<at::Tensor> pieces;
  pieces.reserve(N);
  for (int64_t n = 0; n < N; ++n) {
    int64_t const start = cu[n], len = cu[n + 1] - cu[n];
    if (len == 0) {
      pieces.push_back(x.narrow(0, start, 0));
      continue;
    }
    at::Tensor xe = x.narrow(0, start, len).t().unsqueeze(0);  // [1, C, L]
    int64_t padding = pad;
    if (initial_state.defined()) {
      xe = at::cat({initial_state.select(0, n).unsqueeze(0), xe}, 2);  // [1, C, W−1+L]
      padding = 0;
    }
    int64_t const stride = 1, dilation = 1;
    at::Tensor const ye = at::conv1d(xe, w, {}, stride, padding, dilation, /*groups=*/C).narrow(2, 0, len);
    pieces.push_back(ye.squeeze(0).t());  // [L, C]
  }
  at::Tensor const y = at::cat(pieces, 0);
  return silu ? at::silu(y) : y;
}

#ifdef FUSEPACK_WITH_CUDA_KERNELS
Conv1dFwdParams fwd_params(at::Tensor const& x, at::Tensor const& weight, at::Tensor const& cu_seqlens, bool silu) {
  Conv1dFwdParams p;
  p.x = x.data_ptr();
  p.weight = weight.data_ptr();
  p.cu_seqlens = cu_seqlens.data_ptr<int32_t>();
  p.T = x.size(0);
  p.C = x.size(1);
  p.W = static_cast<int>(weight.size(1));
  p.N = static_cast<int>(cu_seqlens.size(0) - 1);
  p.silu = silu;
  p.dtype = kernel_dtype(x);
  return p;
}

struct Conv1dFunction : torch::autograd::Function<Conv1dFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor const& x, at::Tensor const& weight,
                            at::Tensor const& cu_seqlens, bool silu) {
    FUSEPACK_OP_RUNS("conv1d", Pass::kForward, Backend::kFused);
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor y = at::empty_like(x);
    Conv1dFwdParams p = fwd_params(x, weight, cu_seqlens, silu);
    p.y = y.data_ptr();
    run_conv1d_fwd(p, at::cuda::getCurrentCUDAStream());
    ctx->save_for_backward({x, weight, cu_seqlens});
    ctx->saved_data["silu"] = silu;
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    FUSEPACK_OP_RUNS("conv1d", Pass::kBackward, Backend::kFused);
    auto const saved = ctx->get_saved_variables();
    at::Tensor const &x = saved[0], &weight = saved[1], &cu_seqlens = saved[2];
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor const dy = grads[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty_like(x), dweight = at::empty_like(weight);
    Conv1dBwdParams p;
    static_cast<Conv1dFwdParams&>(p) = fwd_params(x, weight, cu_seqlens, ctx->saved_data["silu"].toBool());
    at::Tensor const partial =
        at::empty({conv1d_bwd_num_partials(p), p.C, p.W}, x.options().dtype(at::kFloat));  // fp32 workspace
    p.dy = dy.data_ptr();
    p.dx = dx.data_ptr();
    p.dweight = dweight.data_ptr();
    p.dweight_partial = partial.data_ptr<float>();
    run_conv1d_bwd(p, at::cuda::getCurrentCUDAStream());
    return {dx, dweight, at::Tensor(), at::Tensor()};
  }
};
#endif

}  // namespace

at::Tensor conv1d(at::Tensor const& x, at::Tensor const& weight, at::Tensor const& cu_seqlens, bool silu,
                  Backend backend, at::Tensor const& initial_state) {
  char const* const op = "conv1d";
  check_sizes(op, "x", x, {-1, -1});
  int64_t const T = x.size(0), C = x.size(1);
  TORCH_CHECK(C >= 1, op, ": x must have at least one channel; got shape ", x.sizes());
  TORCH_CHECK(x.is_floating_point(), op, ": x must be a floating-point tensor; got ", x.scalar_type());
  check_sizes(op, "weight", weight, {C, -1});
  int64_t const W = weight.size(1);
  TORCH_CHECK(W >= 1 && W <= 4, op, ": weight width W (dimension 1 of weight ", weight.sizes(),
              ") must be in 1..4; got W=", W);
  check_same_dtype_device(op, "weight", weight, "x", x);
  std::vector<int32_t> const cu = check_cu_seqlens(op, cu_seqlens, T);
  int64_t const N = static_cast<int64_t>(cu.size()) - 1;
  if (initial_state.defined()) {
    check_sizes(op, "initial_state", initial_state, {N, C, W - 1});
    check_same_dtype_device(op, "initial_state", initial_state, "x", x);
  }
  if (backend == Backend::kComposite) return conv1d_composite(x, weight, cu, silu, initial_state);

  TORCH_CHECK(conv1d_width_supported(W), op, ": ", conv1d_width_refusal(W), " (weight ", weight.sizes(),
              "); the composite backend runs every W in 1..4");
  TORCH_CHECK(!initial_state.defined(), op, ": the fused kernel does not take initial_state yet (composite only); "
              "got initial_state of shape ", initial_state.sizes());
  check_fused_input(op, "x", x);
  check_fused_input(op, "weight", weight);
  TORCH_CHECK(cu_seqlens.device() == x.device(), op, ": the fused kernel needs cu_seqlens on x's device ",
              x.device(), "; got ", cu_seqlens.device());
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  return Conv1dFunction::apply(x, weight, cu_seqlens.contiguous(), silu);
#else
  TORCH_CHECK(false, "conv1d: unreachable without CUDA kernels");
#endif
}

}  // namespace fusepack::ops
