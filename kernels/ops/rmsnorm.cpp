#include "kernels/ops/rmsnorm.h"

#include "kernels/ops/check.h"
#include "kernels/ops/op_scope.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef FUSEPACK_WITH_CUDA_KERNELS
#include "kernels/ops/dtype.h"
#include "kernels/rmsnorm/rmsnorm.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fusepack::ops {

namespace {

// HF Qwen3_5RMSNorm: normalise in fp32 (fp64 stays fp64), scale by (1 + w) in fp32, cast back once.
at::Tensor rmsnorm_composite(at::Tensor const& x, at::Tensor const& weight, double eps) {
  FUSEPACK_OP_RUNS("rmsnorm", Pass::kForward, Backend::kComposite);
  at::ScalarType const compute = at::promote_types(x.scalar_type(), at::kFloat);
  at::Tensor const xf = x.to(compute);
  at::Tensor const normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (normed * (1.0 + weight.to(compute))).to(x.scalar_type());
}

// HF Qwen3_5RMSNormGated: normalise in fp32 (fp64 stays fp64), cast to the input dtype, multiply by w in that dtype,
// multiply by silu(z) in fp32, cast back.
at::Tensor gated_rmsnorm_composite(at::Tensor const& x, at::Tensor const& z, at::Tensor const& weight, double eps) {
  FUSEPACK_OP_RUNS("gated_rmsnorm", Pass::kForward, Backend::kComposite);
  at::ScalarType const dtype = x.scalar_type(), compute = at::promote_types(dtype, at::kFloat);
  at::Tensor const xf = x.to(compute);
  at::Tensor const normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  at::Tensor const scaled = weight * normed.to(dtype);
  return (scaled * at::silu(z.to(compute))).to(dtype);
}

// The checks both forms share; `z` is checked by the caller of the gated form.
void check_norm_args(char const* op, at::Tensor const& x, at::Tensor const& weight, double eps) {
  TORCH_CHECK(x.defined() && x.dim() >= 1, op, ": x must be [..., D] with at least 1 dimension; got ",
              x.defined() ? c10::str("shape ", x.sizes()) : std::string("no tensor"));
  check_sizes(op, "weight", weight, {x.size(-1)});
  check_same_dtype_device(op, "weight", weight, "x", x);
  TORCH_CHECK(eps > 0, op, ": eps must be > 0; got ", eps);
}

void check_norm_fused(char const* op, at::Tensor const& x, at::Tensor const& z, at::Tensor const& weight) {
  check_fused_input(op, "x", x);
  if (z.defined()) check_fused_input(op, "z", z);
  check_fused_input(op, "weight", weight);
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  TORCH_CHECK(x.size(-1) >= 1 && x.size(-1) <= kNormMaxDim, op, ": the fused kernel keeps a row in registers and "
              "supports 1 <= D <= ", kNormMaxDim, "; got x of shape ", x.sizes(), " (D = ", x.size(-1), ")");
#endif
}

#ifdef FUSEPACK_WITH_CUDA_KERNELS
// Both forms: `z` undefined is the plain form. Saves x, z, weight and the fp32 rstd for the backward.
at::Tensor norm_fwd(torch::autograd::AutogradContext* ctx, at::Tensor const& x, at::Tensor const& z,
                    at::Tensor const& weight, double eps) {
  c10::cuda::CUDAGuard guard(x.device());
  int64_t const dim = x.size(-1), rows = x.numel() / dim;
  at::Tensor y = at::empty_like(x);
  at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  RmsNormFwdParams p;
  p.x = x.data_ptr();
  p.z = z.defined() ? z.data_ptr() : nullptr;
  p.weight = weight.data_ptr();
  p.y = y.data_ptr();
  p.rstd = rstd.data_ptr<float>();
  p.rows = rows;
  p.dim = dim;
  p.eps = static_cast<float>(eps);
  p.dtype = kernel_dtype(x);
  run_rmsnorm_fwd(p, at::cuda::getCurrentCUDAStream());
  ctx->save_for_backward({x, z, weight, rstd});
  return y;
}

// {dx, dz (undefined in the plain form), dweight}.
torch::autograd::tensor_list norm_bwd(torch::autograd::AutogradContext* ctx, at::Tensor const& dy_in) {
  auto const saved = ctx->get_saved_variables();
  at::Tensor const &x = saved[0], &z = saved[1], &weight = saved[2], &rstd = saved[3];
  at::Tensor const dy = dy_in.contiguous();
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x), dweight = at::empty_like(weight);
  at::Tensor dz = z.defined() ? at::empty_like(z) : at::Tensor();
  RmsNormBwdParams p;
  p.x = x.data_ptr();
  p.z = z.defined() ? z.data_ptr() : nullptr;
  p.weight = weight.data_ptr();
  p.rstd = rstd.data_ptr<float>();
  p.rows = rstd.size(0);
  p.dim = x.size(-1);
  p.dtype = kernel_dtype(x);
  p.dy = dy.data_ptr();
  p.dx = dx.data_ptr();
  p.dz = dz.defined() ? dz.data_ptr() : nullptr;
  p.dweight = dweight.data_ptr();
  p.num_partials = rmsnorm_bwd_num_partials(p);
  at::Tensor partial = at::empty({p.num_partials, p.dim}, x.options().dtype(at::kFloat));
  p.dweight_partial = partial.data_ptr<float>();
  run_rmsnorm_bwd(p, at::cuda::getCurrentCUDAStream());
  return {dx, dz, dweight};
}

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor const& x, at::Tensor const& weight,
                            double eps) {
    FUSEPACK_OP_RUNS("rmsnorm", Pass::kForward, Backend::kFused);
    return norm_fwd(ctx, x, at::Tensor(), weight, eps);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    FUSEPACK_OP_RUNS("rmsnorm", Pass::kBackward, Backend::kFused);
    torch::autograd::tensor_list const g = norm_bwd(ctx, grads[0]);
    return {g[0], g[2], at::Tensor()};
  }
};

struct GatedRmsNormFunction : torch::autograd::Function<GatedRmsNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor const& x, at::Tensor const& z,
                            at::Tensor const& weight, double eps) {
    FUSEPACK_OP_RUNS("gated_rmsnorm", Pass::kForward, Backend::kFused);
    return norm_fwd(ctx, x, z, weight, eps);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    FUSEPACK_OP_RUNS("gated_rmsnorm", Pass::kBackward, Backend::kFused);
    torch::autograd::tensor_list const g = norm_bwd(ctx, grads[0]);
    return {g[0], g[1], g[2], at::Tensor()};
  }
};
#endif

}  // namespace

at::Tensor rmsnorm(at::Tensor const& x, at::Tensor const& weight, double eps, Backend backend) {
  check_norm_args("rmsnorm", x, weight, eps);
  if (backend == Backend::kComposite) return rmsnorm_composite(x, weight, eps);
  check_norm_fused("rmsnorm", x, at::Tensor(), weight);
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  return RmsNormFunction::apply(x, weight, eps);
#else
  TORCH_CHECK(false, "rmsnorm: unreachable without CUDA kernels");
#endif
}

at::Tensor gated_rmsnorm(at::Tensor const& x, at::Tensor const& z, at::Tensor const& weight, double eps,
                         Backend backend) {
  check_norm_args("gated_rmsnorm", x, weight, eps);
  TORCH_CHECK(z.defined(), "gated_rmsnorm: z is required but was not given");
  TORCH_CHECK(z.sizes() == x.sizes(), "gated_rmsnorm: z has shape ", z.sizes(), " but x has ", x.sizes(),
              "; they must match");
  check_same_dtype_device("gated_rmsnorm", "z", z, "x", x);
  if (backend == Backend::kComposite) return gated_rmsnorm_composite(x, z, weight, eps);
  check_norm_fused("gated_rmsnorm", x, z, weight);
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  return GatedRmsNormFunction::apply(x, z, weight, eps);
#else
  TORCH_CHECK(false, "gated_rmsnorm: unreachable without CUDA kernels");
#endif
}

}  // namespace fusepack::ops
