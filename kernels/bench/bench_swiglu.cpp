#include "kernels/bench/bench.h"
#include "kernels/ops/swiglu.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>

namespace fusepack::bench {

// Qwen3.5-27B MLP: 8192 tokens × intermediate 17408, bf16.
void bench_swiglu(Report& report) {
  int64_t const T = 8192, I = 17408;
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor gate = at::randn({T, I}, opts).requires_grad_(), up = at::randn({T, I}, opts).requires_grad_();
  at::Tensor const dy = at::randn({T, I}, opts);
  double const elem = 2.0 * T * I;  // bytes of one [T, I] bf16 tensor
  auto fwd = [&](ops::Backend b) { return ops::swiglu(gate, up, b); };
  auto fwd_bwd = [&](ops::Backend b) { return torch::autograd::grad({fwd(b)}, {gate, up}, {dy}); };

  expect_close("swiglu", "y", fwd(ops::Backend::kFused), fwd(ops::Backend::kComposite), 1e-2);
  auto const gf = fwd_bwd(ops::Backend::kFused), gc = fwd_bwd(ops::Backend::kComposite);
  expect_close("swiglu", "dgate", gf[0], gc[0], 1e-2);
  expect_close("swiglu", "dup", gf[1], gc[1], 1e-2);

  std::string const shape = "T=8192 I=17408 bf16";
  {
    c10::InferenceMode inference;
    report.add({"swiglu", shape, "fwd", time_cuda([&] { fwd(ops::Backend::kComposite); }).ms,
                time_cuda([&] { fwd(ops::Backend::kFused); }).ms, 3 * elem});
  }
  // forward (read 2, write 1) + backward (read 3, write 2)
  report.add({"swiglu", shape, "fwd+bwd", time_cuda([&] { fwd_bwd(ops::Backend::kComposite); }).ms,
              time_cuda([&] { fwd_bwd(ops::Backend::kFused); }).ms, 8 * elem});
}

}  // namespace fusepack::bench
