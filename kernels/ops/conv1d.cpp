#include "kernels/ops/conv1d.h"

#include "kernels/conv1d/conv1d_widths.h"
#include "kernels/ops/check.h"
#include "kernels/ops/op_scope.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <vector>

#ifdef FUSEPACK_WITH_CUDA_KERNELS
#include "kernels/conv1d/conv1d.h"
#include "kernels/ops/dtype.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fusepack::ops {

namespace {

constexpr std::size_t kMaxParts = 4;  // conv1d_parts' widths
#ifdef FUSEPACK_WITH_CUDA_KERNELS
static_assert(kMaxParts == static_cast<std::size_t>(kConv1dMaxParts), "the kernel's parameters hold every part");
#endif

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

// y in column parts of `widths` (one part of C columns: the plain [T, C] output), each part its own contiguous
// tensor written by the kernel; the backward reads the parts' gradients where they are.
struct Conv1dFunction : torch::autograd::Function<Conv1dFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor const& x,
                                                at::Tensor const& weight, at::Tensor const& cu_seqlens, bool silu,
                                                std::vector<std::int64_t> const& widths) {
    FUSEPACK_OP_RUNS("conv1d", Pass::kForward, Backend::kFused);
    c10::cuda::CUDAGuard guard(x.device());
    Conv1dFwdParams p = fwd_params(x, weight, cu_seqlens, silu);
    torch::autograd::variable_list parts;
    for (std::int64_t w : widths) parts.push_back(at::empty({x.size(0), w}, x.options()));
    p.y = column_parts(parts);
    run_conv1d_fwd(p, at::cuda::getCurrentCUDAStream());
    ctx->save_for_backward({x, weight, cu_seqlens});
    ctx->saved_data["silu"] = silu;
    return parts;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    FUSEPACK_OP_RUNS("conv1d", Pass::kBackward, Backend::kFused);
    auto const saved = ctx->get_saved_variables();
    at::Tensor const &x = saved[0], &weight = saved[1], &cu_seqlens = saved[2];
    c10::cuda::CUDAGuard guard(x.device());
    // A part the graph did not reach arrives as zeros (autograd materializes the missing gradients).
    std::vector<at::Tensor> dy;
    for (at::Tensor const& g : grads) dy.push_back(g.to(x.scalar_type()).contiguous());
    at::Tensor dx = at::empty_like(x), dweight = at::empty_like(weight);
    Conv1dBwdParams p;
    static_cast<Conv1dFwdParams&>(p) = fwd_params(x, weight, cu_seqlens, ctx->saved_data["silu"].toBool());
    at::Tensor const partial =
        at::empty({conv1d_bwd_num_partials(p), p.C, p.W}, x.options().dtype(at::kFloat));  // fp32 workspace
    p.dy = column_parts(dy);
    p.dx = dx.data_ptr();
    p.dweight = dweight.data_ptr();
    p.dweight_partial = partial.data_ptr<float>();
    run_conv1d_bwd(p, at::cuda::getCurrentCUDAStream());
    return {dx, dweight, at::Tensor(), at::Tensor(), at::Tensor()};
  }

 private:
  static Conv1dColumnParts column_parts(std::vector<at::Tensor> const& parts) {
    Conv1dColumnParts c;
    c.count = static_cast<int>(parts.size());
    for (int i = 0; i < c.count; ++i) {
      c.part[i] = parts[i].data_ptr();
      c.start[i + 1] = c.start[i] + parts[i].size(1);
    }
    return c;
  }
};
#endif

}  // namespace

namespace {

// Checks every input of conv1d / conv1d_parts (`parts`: their column counts; none for conv1d's one part of C
// columns), then runs the backend.
std::vector<at::Tensor> conv1d_checked(char const* op, at::Tensor const& x, at::Tensor const& weight,
                                       at::Tensor const& cu_seqlens, bool silu, Backend backend,
                                       at::Tensor const& initial_state,
                                       std::optional<std::vector<std::int64_t>> parts) {
  check_sizes(op, "x", x, {-1, -1});
  int64_t const T = x.size(0), C = x.size(1);
  std::vector<std::int64_t> const widths = parts ? std::move(*parts) : std::vector<std::int64_t>{C};
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
  std::int64_t total = 0;
  for (std::int64_t w : widths) {
    TORCH_CHECK(w >= 0, op, ": every width must be >= 0; got ", w, " in ", c10::IntArrayRef(widths));
    total += w;
  }
  TORCH_CHECK(!widths.empty() && widths.size() <= kMaxParts && total == C, op,
              ": widths must be 1..", kMaxParts, " column counts summing to x's ", C, " channels; got ",
              c10::IntArrayRef(widths));
  if (backend == Backend::kComposite) {
    at::Tensor const y = conv1d_composite(x, weight, cu, silu, initial_state);
    if (widths.size() == 1) return {y};
    std::vector<at::Tensor> columns;
    std::int64_t start = 0;
    for (std::int64_t w : widths) {
      columns.push_back(y.narrow(1, start, w).contiguous());
      start += w;
    }
    return columns;
  }

  TORCH_CHECK(conv1d_width_supported(W), op, ": ", conv1d_width_refusal(W), " (weight ", weight.sizes(),
              "); the composite backend runs every W in 1..4");
  TORCH_CHECK(!initial_state.defined(), op, ": the fused kernel does not take initial_state yet (composite only); "
              "got initial_state of shape ", initial_state.sizes());
  check_fused_input(op, "x", x);
  check_fused_input(op, "weight", weight);
  TORCH_CHECK(cu_seqlens.device() == x.device(), op, ": the fused kernel needs cu_seqlens on x's device ",
              x.device(), "; got ", cu_seqlens.device());
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  return Conv1dFunction::apply(x, weight, cu_seqlens.contiguous(), silu, widths);
#else
  TORCH_CHECK(false, op, ": unreachable without CUDA kernels");
#endif
}

}  // namespace

at::Tensor conv1d(at::Tensor const& x, at::Tensor const& weight, at::Tensor const& cu_seqlens, bool silu,
                  Backend backend, at::Tensor const& initial_state) {
  return conv1d_checked("conv1d", x, weight, cu_seqlens, silu, backend, initial_state, std::nullopt).front();
}

std::vector<at::Tensor> conv1d_parts(at::Tensor const& x, at::Tensor const& weight, at::Tensor const& cu_seqlens,
                                     bool silu, std::vector<std::int64_t> const& widths, Backend backend) {
  return conv1d_checked("conv1d_parts", x, weight, cu_seqlens, silu, backend, at::Tensor(), widths);
}

}  // namespace fusepack::ops
