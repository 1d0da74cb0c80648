#include "kernels/bench/bench.h"
#include "kernels/ops/gated_rmsnorm.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>

namespace fusepack::bench {

// Qwen3.5-27B GDN output norm: 8192 tokens × 48 value heads × head_v_dim 128, bf16, eps 1e-6.
void bench_gated_rmsnorm(Report& report) {
  int64_t const T = 8192, H = 48, D = 128;
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor x = at::randn({T, H, D}, opts).requires_grad_(), z = at::randn({T, H, D}, opts).requires_grad_();
  at::Tensor w = (1.0 + 0.1 * at::randn({D}, opts)).requires_grad_();
  at::Tensor const dy = at::randn({T, H, D}, opts);
  double const elem = 2.0 * T * H * D, rows = double(T * H), vec = 2.0 * D;
  auto fwd = [&](ops::Backend b) { return ops::gated_rmsnorm(x, z, w, 1e-6, b); };
  auto fwd_bwd = [&](ops::Backend b) { return torch::autograd::grad({fwd(b)}, {x, z, w}, {dy}); };

  expect_close("gated_rmsnorm", "y", fwd(ops::Backend::kFused), fwd(ops::Backend::kComposite), 1e-2);
  auto const gf = fwd_bwd(ops::Backend::kFused), gc = fwd_bwd(ops::Backend::kComposite);
  expect_close("gated_rmsnorm", "dx", gf[0], gc[0], 1e-2);
  expect_close("gated_rmsnorm", "dz", gf[1], gc[1], 1e-2);
  expect_close("gated_rmsnorm", "dweight", gf[2], gc[2], 1e-2);

  std::string const shape = "T=8192 H=48 D=128 bf16";
  {
    c10::InferenceMode inference;
    // read x, z, w; write y, rstd (fp32)
    report.add({"gated_rmsnorm", shape, "fwd", time_cuda([&] { fwd(ops::Backend::kComposite); }).ms,
                time_cuda([&] { fwd(ops::Backend::kFused); }).ms, 3 * elem + vec + 4 * rows});
  }
  // forward as above + backward (read x, z, dy, w, rstd; write dx, dz, dweight)
  report.add({"gated_rmsnorm", shape, "fwd+bwd", time_cuda([&] { fwd_bwd(ops::Backend::kComposite); }).ms,
              time_cuda([&] { fwd_bwd(ops::Backend::kFused); }).ms, 8 * elem + 3 * vec + 8 * rows});
}

}  // namespace fusepack::bench
