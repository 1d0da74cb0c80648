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

#ifdef FUSEPACK_WITH_CUDA_KERNELS
struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor const& x, at::Tensor const& weight,
                            double eps) {
    FUSEPACK_OP_RUNS("rmsnorm", Pass::kForward, Backend::kFused);
    c10::cuda::CUDAGuard guard(x.device());
    int64_t const dim = x.size(-1), rows = x.numel() / dim;
    at::Tensor y = at::empty_like(x);
    at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    RmsNormFwdParams p;
    p.x = x.data_ptr();
    p.weight = weight.data_ptr();
    p.y = y.data_ptr();
    p.rstd = rstd.data_ptr<float>();
    p.rows = rows;
    p.dim = dim;
    p.eps = static_cast<float>(eps);
    p.dtype = kernel_dtype(x);
    run_rmsnorm_fwd(p, at::cuda::getCurrentCUDAStream());
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    FUSEPACK_OP_RUNS("rmsnorm", Pass::kBackward, Backend::kFused);
    auto const saved = ctx->get_saved_variables();
    at::Tensor const &x = saved[0], &weight = saved[1], &rstd = saved[2];
    at::Tensor const dy = grads[0].contiguous();
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor dx = at::empty_like(x), dweight = at::empty_like(weight);
    RmsNormBwdParams p;
    p.x = x.data_ptr();
    p.weight = weight.data_ptr();
    p.rstd = rstd.data_ptr<float>();
    p.rows = rstd.size(0);
    p.dim = x.size(-1);
    p.dtype = kernel_dtype(x);
    p.dy = dy.data_ptr();
    p.dx = dx.data_ptr();
    p.dweight = dweight.data_ptr();
    p.num_partials = rmsnorm_bwd_num_partials(p);
    at::Tensor partial = at::empty({p.num_partials, p.dim}, x.options().dtype(at::kFloat));
    p.dweight_partial = partial.data_ptr<float>();
    run_rmsnorm_bwd(p, at::cuda::getCurrentCUDAStream());
    return {dx, dweight, at::Tensor()};
  }
};
#endif

}  // namespace

at::Tensor rmsnorm(at::Tensor const& x, at::Tensor const& weight, double eps, Backend backend) {
  TORCH_CHECK(x.defined() && x.dim() >= 1, "rmsnorm: x must be [..., D] with at least 1 dimension; got ",
              x.defined() ? c10::str("shape ", x.sizes()) : std::string("no tensor"));
  check_sizes("rmsnorm", "weight", weight, {x.size(-1)});
  check_same_dtype_device("rmsnorm", "weight", weight, "x", x);
  TORCH_CHECK(eps > 0, "rmsnorm: eps must be > 0; got ", eps);
  if (backend == Backend::kComposite) return rmsnorm_composite(x, weight, eps);
  check_fused_input("rmsnorm", "x", x);
  check_fused_input("rmsnorm", "weight", weight);
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  TORCH_CHECK(x.size(-1) >= 1 && x.size(-1) <= kNormMaxDim, "rmsnorm: the fused kernel keeps a row in registers and "
              "supports 1 <= D <= ", kNormMaxDim, "; got x of shape ", x.sizes(), " (D = ", x.size(-1), ")");
  return RmsNormFunction::apply(x, weight, eps);
#else
  TORCH_CHECK(false, "rmsnorm: unreachable without CUDA kernels");
#endif
}

}  // namespace fusepack::ops
