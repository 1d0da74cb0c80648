#include "kernels/bench/bench.h"
#include "kernels/ops/rope.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

namespace fusepack::bench {

// Qwen3.5-27B attention: q of 8192 tokens (8 packed examples of 1024, positions restarting at 0) × 24 heads × 256,
// rotary_dim 64, theta 1e7, bf16. k (4 heads) is the same kernel on a sixth of the bytes.
void bench_rope(Report& report) {
  int64_t const T = 8192, H = 24, D = 256, rotary_dim = 64;
  double const theta = 1e7;
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor x = at::randn({T, H, D}, opts).requires_grad_();
  at::Tensor const dy = at::randn({T, H, D}, opts);
  at::Tensor const pos = at::arange(T, opts.dtype(at::kLong)).remainder(1024);
  double const elem = 2.0 * T * H * D;  // bytes of one [T, H, D] bf16 tensor
  auto fwd = [&](ops::Backend b) { return ops::rope(x, pos, rotary_dim, theta, b); };
  auto fwd_bwd = [&](ops::Backend b) { return torch::autograd::grad({fwd(b)}, {x}, {dy}); };

  expect_close("rope", "y", fwd(ops::Backend::kFused), fwd(ops::Backend::kComposite), 1e-2);
  expect_close("rope", "dx", fwd_bwd(ops::Backend::kFused)[0], fwd_bwd(ops::Backend::kComposite)[0], 1e-2);

  std::string const shape = "T=8192 H=24 D=256 r=64 bf16";
  {
    c10::InferenceMode inference;
    // read x, write y (the 64 KB of positions are noise)
    report.add({"rope", shape, "fwd", time_cuda([&] { fwd(ops::Backend::kComposite); }).ms,
                time_cuda([&] { fwd(ops::Backend::kFused); }).ms, 2 * elem});
  }
  // forward (read x, write y) + backward (read dy, write dx)
  report.add({"rope", shape, "fwd+bwd", time_cuda([&] { fwd_bwd(ops::Backend::kComposite); }).ms,
              time_cuda([&] { fwd_bwd(ops::Backend::kFused); }).ms, 4 * elem});
}

}  // namespace fusepack::bench
