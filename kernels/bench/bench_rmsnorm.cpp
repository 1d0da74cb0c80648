#include "kernels/bench/bench.h"
#include "kernels/ops/rmsnorm.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

namespace fusepack::bench {

namespace {

// One norm case: x of `shape` (D last), bf16, eps 1e-6; the gated form (gated_rmsnorm) with a gate z of x's shape
// and w near its initial ones, the plain form (rmsnorm) with the checkpoint's small w (gain 1 + w).
void bench_norm_case(Report& report, bool gated, std::vector<int64_t> const& shape, std::string const& name) {
  std::string const op = gated ? "gated_rmsnorm" : "rmsnorm";
  int64_t const D = shape.back();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor x = at::randn(shape, opts).requires_grad_();
  at::Tensor z = gated ? at::randn(shape, opts).requires_grad_() : at::Tensor();
  at::Tensor w = ((gated ? 1.0 : 0.0) + 0.1 * at::randn({D}, opts)).requires_grad_();
  at::Tensor const dy = at::randn(shape, opts);
  double const elem = 2.0 * x.numel(), rows = double(x.numel() / D), vec = 2.0 * D;
  std::vector<at::Tensor> const inputs = gated ? std::vector<at::Tensor>{x, z, w} : std::vector<at::Tensor>{x, w};
  std::vector<std::string> const grad_names =
      gated ? std::vector<std::string>{"dx", "dz", "dweight"} : std::vector<std::string>{"dx", "dweight"};
  auto fwd = [&](ops::Backend b) { return gated ? ops::gated_rmsnorm(x, z, w, 1e-6, b) : ops::rmsnorm(x, w, 1e-6, b); };
  auto fwd_bwd = [&](ops::Backend b) { return torch::autograd::grad({fwd(b)}, inputs, {dy}); };

  expect_close(op, "y", fwd(ops::Backend::kFused), fwd(ops::Backend::kComposite), 1e-2);
  auto const gf = fwd_bwd(ops::Backend::kFused), gc = fwd_bwd(ops::Backend::kComposite);
  for (std::size_t i = 0; i < grad_names.size(); ++i) expect_close(op, grad_names[i], gf[i], gc[i], 1e-2);

  double const row_tensors = gated ? 2 : 1;  // x (and z)
  {
    c10::InferenceMode inference;
    // read x (z), w; write y, rstd (fp32)
    report.add({op, name, "fwd", time_cuda([&] { fwd(ops::Backend::kComposite); }).ms,
                time_cuda([&] { fwd(ops::Backend::kFused); }).ms, (row_tensors + 1) * elem + vec + 4 * rows});
  }
  // forward as above + backward (read x, (z,) dy, w, rstd; write dx, (dz,) dweight)
  report.add({op, name, "fwd+bwd", time_cuda([&] { fwd_bwd(ops::Backend::kComposite); }).ms,
              time_cuda([&] { fwd_bwd(ops::Backend::kFused); }).ms,
              (3 * row_tensors + 2) * elem + 3 * vec + 8 * rows});
}

}  // namespace

// Qwen3.5-27B, 8192 tokens: the layer norms over hidden 5120 and the q norm over 24 heads of head_dim 256.
void bench_rmsnorm(Report& report) {
  bench_norm_case(report, false, {8192, 5120}, "T=8192 D=5120 bf16");
  bench_norm_case(report, false, {8192, 24, 256}, "T=8192 H=24 D=256 bf16");
}

// Qwen3.5-27B GDN output norm: 8192 tokens × 48 value heads × head_v_dim 128.
void bench_gated_rmsnorm(Report& report) { bench_norm_case(report, true, {8192, 48, 128}, "T=8192 H=48 D=128 bf16"); }

}  // namespace fusepack::bench
