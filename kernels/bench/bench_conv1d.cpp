#include "kernels/bench/bench.h"
#include "kernels/ops/conv1d.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

namespace fusepack::bench {

// Qwen3.5-27B Gated DeltaNet short conv: 8192 tokens packed as 8 × 1024, conv_dim 10240, W = 4, SiLU, bf16.
void bench_conv1d(Report& report) {
  int64_t const T = 8192, C = 10240, W = 4, examples = 8;
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor x = at::randn({T, C}, opts).requires_grad_();
  at::Tensor weight = (0.5 * at::randn({C, W}, opts)).detach().requires_grad_();
  at::Tensor const dy = at::randn({T, C}, opts);
  std::vector<int32_t> cu_host;
  for (int64_t n = 0; n <= examples; ++n) cu_host.push_back(static_cast<int32_t>(n * T / examples));
  at::Tensor const cu = at::tensor(cu_host, at::kInt).to(at::kCUDA);
  double const elem = 2.0 * T * C;  // bytes of one [T, C] bf16 tensor
  auto fwd = [&](ops::Backend b) { return ops::conv1d(x, weight, cu, /*silu=*/true, b); };
  auto fwd_bwd = [&](ops::Backend b) { return torch::autograd::grad({fwd(b)}, {x, weight}, {dy}); };

  expect_close("conv1d", "y", fwd(ops::Backend::kFused), fwd(ops::Backend::kComposite), 1e-2);
  auto const gf = fwd_bwd(ops::Backend::kFused), gc = fwd_bwd(ops::Backend::kComposite);
  expect_close("conv1d", "dx", gf[0], gc[0], 1e-2);
  expect_close("conv1d", "dweight", gf[1], gc[1], 1e-2);

  std::string const shape = "T=8x1024 C=10240 W=4 bf16";
  {
    c10::InferenceMode inference;
    // read x, write y
    report.add({"conv1d", shape, "fwd", time_cuda([&] { fwd(ops::Backend::kComposite); }).ms,
                time_cuda([&] { fwd(ops::Backend::kFused); }).ms, 2 * elem});
  }
  // forward (read x, write y) + backward (read x and dy, write dx); weight and dweight are 80 KB each
  report.add({"conv1d", shape, "fwd+bwd", time_cuda([&] { fwd_bwd(ops::Backend::kComposite); }).ms,
              time_cuda([&] { fwd_bwd(ops::Backend::kFused); }).ms, 5 * elem});
}

}  // namespace fusepack::bench
