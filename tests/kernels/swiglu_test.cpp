// swiglu on both backends: the fused kernel against the fp64 reference under docs/contracts.md, numerics, with the
// composite in the same dtype as baseline (suites *Fused*: labels kernels + gpu); the composite on the CPU against the
// reference in fp64; determinism; bad input.
#include "kernels/ops/swiglu.h"
#include "reference/swiglu.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/torch_bridge.h"
#include "verify/random.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

#include <string>
#include <tuple>

namespace fusepack::test {
namespace {

using ops::Backend;
using ref::Tensor;

struct SwiGluShape {
  std::string name;
  int64_t rows, cols;
};

// Forward and both gradients of one backend, for loss = <dy, y>.
struct SwiGluRun {
  at::Tensor y, dgate, dup;
};

SwiGluRun run(Backend backend, at::Tensor const& gate0, at::Tensor const& up0, at::Tensor const& dy) {
  at::Tensor gate = gate0.detach().clone().requires_grad_(), up = up0.detach().clone().requires_grad_();
  at::Tensor y = ops::swiglu(gate, up, backend);
  auto grads = torch::autograd::grad({y}, {gate, up}, {dy});
  return {y.detach(), grads[0], grads[1]};
}

TEST(SwiGluComposite, MatchesReferenceOnCpuInFp64) {
  auto rng = test_rng();
  Tensor const gate = randn({5, 19}, rng, 2.0), up = randn({5, 19}, rng), dy = randn({5, 19}, rng);
  at::Device const cpu(at::kCPU);
  SwiGluRun const r = run(Backend::kComposite, to_torch(gate, at::kDouble, cpu), to_torch(up, at::kDouble, cpu),
                          to_torch(dy, at::kDouble, cpu));
  ref::SwiGluGrads const g = ref::swiglu_bwd(dy, gate, up);
  // Both sides compute the same fp64 formula with different operation orders: 1e-13 relative covers that.
  Tolerance const tol{1e-14, 1e-13};
  FUSEPACK_EXPECT_PASS(compare_allclose("y", to_ref(r.y), ref::swiglu_fwd(gate, up), tol));
  FUSEPACK_EXPECT_PASS(compare_allclose("dgate", to_ref(r.dgate), g.dgate, tol));
  FUSEPACK_EXPECT_PASS(compare_allclose("dup", to_ref(r.dup), g.dup, tol));
}

class SwiGluFused : public ::testing::TestWithParam<std::tuple<Dtype, SwiGluShape>> {};

TEST_P(SwiGluFused, MatchesReference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto const [dtype, shape] = GetParam();
  auto rng = test_rng();
  Tensor gate = randn({shape.rows, shape.cols}, rng, 2.0), up = randn({shape.rows, shape.cols}, rng),
         dy = randn({shape.rows, shape.cols}, rng);
  for (Tensor* t : {&gate, &up, &dy}) round_to(dtype, *t);  // the reference sees exactly the kernel's inputs
  at::Device const cuda(at::kCUDA);
  at::ScalarType const st = scalar_type(dtype);
  at::Tensor const g = to_torch(gate, st, cuda), u = to_torch(up, st, cuda), d = to_torch(dy, st, cuda);
  SwiGluRun const fused = run(Backend::kFused, g, u, d), composite = run(Backend::kComposite, g, u, d);
  ref::SwiGluGrads const want = ref::swiglu_bwd(dy, gate, up);
  FUSEPACK_EXPECT_PASS(check_fused("y", fused.y, composite.y, ref::swiglu_fwd(gate, up)));
  FUSEPACK_EXPECT_PASS(check_fused("dgate", fused.dgate, composite.dgate, want.dgate));
  FUSEPACK_EXPECT_PASS(check_fused("dup", fused.dup, composite.dup, want.dup));
}

INSTANTIATE_TEST_SUITE_P(
    Sm90, SwiGluFused,
    ::testing::Combine(::testing::Values(Dtype::kBF16, Dtype::kF16, Dtype::kF32),
                       ::testing::Values(SwiGluShape{"one_element", 1, 1}, SwiGluShape{"odd_3x1007", 3, 1007},
                                         SwiGluShape{"qwen35_27b_t37_i17408", 37, 17408},
                                         SwiGluShape{"vector_tail_1x13", 1, 13},
                                         // One row (T = 1) at the model's width, on the vector path.
                                         SwiGluShape{"qwen35_27b_t1_i17408", 1, 17408})),
    [](auto const& tc) {
      return std::string(dtype_name(std::get<0>(tc.param))) + "_" + std::get<1>(tc.param).name;
    });

// T = 0: nothing to compute; the outputs and gradients are empty, of the inputs' shape.
TEST(SwiGluFused, EmptyBatchGivesEmptyOutputs) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const empty = at::ones({0, 17408}, opts);
  SwiGluRun const r = run(Backend::kFused, empty, empty, empty);
  EXPECT_EQ(r.y.sizes(), at::IntArrayRef({0, 17408}));
  EXPECT_EQ(r.dgate.sizes(), at::IntArrayRef({0, 17408}));
  EXPECT_EQ(r.dup.sizes(), at::IntArrayRef({0, 17408}));
}

TEST(SwiGluFused, BackwardIsBitwiseDeterministic) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  at::Device const cuda(at::kCUDA);
  at::Tensor const g = to_torch(randn({64, 4099}, rng), at::kBFloat16, cuda),
                   u = to_torch(randn({64, 4099}, rng), at::kBFloat16, cuda),
                   d = to_torch(randn({64, 4099}, rng), at::kBFloat16, cuda);
  SwiGluRun const a = run(Backend::kFused, g, u, d), b = run(Backend::kFused, g, u, d);
  EXPECT_TRUE(at::equal(a.y, b.y));
  EXPECT_TRUE(at::equal(a.dgate, b.dgate));
  EXPECT_TRUE(at::equal(a.dup, b.dup));
}

TEST(SwiGluOps, RejectsBadInput) {
  at::Tensor const a = at::ones({2, 3}), b = at::ones({2, 4});
  EXPECT_THROW(
      {
        try {
          ops::swiglu(a, b, Backend::kComposite);
        } catch (c10::Error const& e) {
          std::printf("[  error   ] %s\n", e.what_without_backtrace());
          EXPECT_NE(std::string(e.what_without_backtrace()).find("gate has shape [2, 3] but up has [2, 4]"),
                    std::string::npos);
          throw;
        }
      },
      c10::Error);
  EXPECT_THROW(ops::swiglu(a, a.to(at::kDouble), Backend::kComposite), c10::Error);
  // The fused backend never falls back: CPU tensors are refused with the reason.
  EXPECT_THROW(ops::swiglu(a, a, Backend::kFused), c10::Error);
}

}  // namespace
}  // namespace fusepack::test
