#include "kernels/bench/bench.h"
#include "kernels/ops/rmsnorm.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

namespace fusepack::bench {

namespace {

// One rmsnorm case: x of `shape` (D last), bf16, eps 1e-6.
void bench_rmsnorm_case(Report& report, std::vector<int64_t> const& shape, std::string const& name) {
  int64_t const D = shape.back();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor x = at::randn(shape, opts).requires_grad_();
  at::Tensor w = (0.1 * at::randn({D}, opts)).requires_grad_();
  at::Tensor const dy = at::randn(shape, opts);
  double const elem = 2.0 * x.numel(), rows = double(x.numel() / D), vec = 2.0 * D;
  auto fwd = [&](ops::Backend b) { return ops::rmsnorm(x, w, 1e-6, b); };
  auto fwd_bwd = [&](ops::Backend b) { return torch::autograd::grad({fwd(b)}, {x, w}, {dy}); };

  expect_close("rmsnorm", "y", fwd(ops::Backend::kFused), fwd(ops::Backend::kComposite), 1e-2);
  auto const gf = fwd_bwd(ops::Backend::kFused), gc = fwd_bwd(ops::Backend::kComposite);
  expect_close("rmsnorm", "dx", gf[0], gc[0], 1e-2);
  expect_close("rmsnorm", "dweight", gf[1], gc[1], 1e-2);

  {
    c10::InferenceMode inference;
    // read x, w; write y, rstd (fp32)
    report.add({"rmsnorm", name, "fwd", time_cuda([&] { fwd(ops::Backend::kComposite); }).ms,
                time_cuda([&] { fwd(ops::Backend::kFused); }).ms, 2 * elem + vec + 4 * rows});
  }
  // forward as above + backward (read x, dy, w, rstd; write dx, dweight)
  report.add({"rmsnorm", name, "fwd+bwd", time_cuda([&] { fwd_bwd(ops::Backend::kComposite); }).ms,
              time_cuda([&] { fwd_bwd(ops::Backend::kFused); }).ms, 5 * elem + 3 * vec + 8 * rows});
}

}  // namespace

// Qwen3.5-27B, 8192 tokens: the layer norms over hidden 5120 and the q norm over 24 heads of head_dim 256.
void bench_rmsnorm(Report& report) {
  bench_rmsnorm_case(report, {8192, 5120}, "T=8192 D=5120 bf16");
  bench_rmsnorm_case(report, {8192, 24, 256}, "T=8192 H=24 D=256 bf16");
}

}  // namespace fusepack::bench
