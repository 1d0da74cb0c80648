#include "kernels/ops/swiglu.h"

#include "kernels/ops/check.h"
#include "kernels/ops/op_scope.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef FUSEPACK_WITH_CUDA_KERNELS
#include "kernels/ops/dtype.h"
#include "kernels/swiglu/swiglu.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fusepack::ops {

namespace {

#ifdef FUSEPACK_WITH_CUDA_KERNELS
struct SwiGluFunction : torch::autograd::Function<SwiGluFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor const& gate, at::Tensor const& up) {
    FUSEPACK_OP_RUNS("swiglu", Pass::kForward, Backend::kFused);
    c10::cuda::CUDAGuard guard(gate.device());
    at::Tensor y = at::empty_like(gate);
    SwiGluFwdParams p;
    p.gate = gate.data_ptr();
    p.up = up.data_ptr();
    p.y = y.data_ptr();
    p.n = gate.numel();
    p.dtype = kernel_dtype(gate);
    run_swiglu_fwd(p, at::cuda::getCurrentCUDAStream());
    ctx->save_for_backward({gate, up});
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    FUSEPACK_OP_RUNS("swiglu", Pass::kBackward, Backend::kFused);
    auto const saved = ctx->get_saved_variables();
    at::Tensor const &gate = saved[0], &up = saved[1];
    at::Tensor const dy = grads[0].contiguous();
    c10::cuda::CUDAGuard guard(gate.device());
    at::Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
    SwiGluBwdParams p;
    p.gate = gate.data_ptr();
    p.up = up.data_ptr();
    p.dy = dy.data_ptr();
    p.dgate = dgate.data_ptr();
    p.dup = dup.data_ptr();
    p.n = gate.numel();
    p.dtype = kernel_dtype(gate);
    run_swiglu_bwd(p, at::cuda::getCurrentCUDAStream());
    return {dgate, dup};
  }
};
#endif

}  // namespace

at::Tensor swiglu(at::Tensor const& gate, at::Tensor const& up, Backend backend) {
  TORCH_CHECK(gate.defined() && up.defined(), "swiglu: gate and up are required");
  TORCH_CHECK(gate.sizes() == up.sizes(), "swiglu: gate has shape ", gate.sizes(), " but up has ", up.sizes(),
              "; they must match");
  check_same_dtype_device("swiglu", "up", up, "gate", gate);
  if (backend == Backend::kComposite) {
    FUSEPACK_OP_RUNS("swiglu", Pass::kForward, Backend::kComposite);
    return at::silu(gate) * up;
  }
  check_fused_input("swiglu", "gate", gate);
  check_fused_input("swiglu", "up", up);
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  return SwiGluFunction::apply(gate, up);
#else
  TORCH_CHECK(false, "swiglu: unreachable without CUDA kernels");
#endif
}

}  // namespace fusepack::ops
