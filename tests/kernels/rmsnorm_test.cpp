// rmsnorm on both backends: the fused kernels against the fp64 reference under docs/contracts.md, numerics, with the
// composite in the same dtype as baseline (suites *Fused*: labels kernels + gpu), forward and both gradients, at the
// Qwen3.5-27B shapes (layer norms [T, 5120], q/k norms [T, 24|4, 256]) and odd ones (D = 7, 1003, 8191, one row,
// misaligned pointers); the composite on the CPU against the reference in fp64; determinism; bad input.
#include "kernels/ops/rmsnorm.h"
#include "kernels/rmsnorm/norm_layout.h"
#include "reference/rmsnorm.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/random.h"
#include "tests/support/torch_bridge.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>

namespace fusepack::test {
namespace {

using ops::Backend;
using ref::Tensor;

constexpr double kEps = 1e-6;  // rms_norm_eps of every released Qwen3.5 checkpoint

struct RmsNormShape {
  std::string name;
  ref::Shape shape;  // x: [..., D]
};

struct RmsNormInputs {
  Tensor x, weight, dy;
};

// x rows away from zero (the norm's derivatives grow like 1/|x| near 0), the checkpoint's w (gain 1 + w) and dy.
RmsNormInputs draw(ref::Shape const& shape, std::mt19937_64& rng) {
  ref::Index const D = shape.back();
  return {randn_rows_away_from_zero(shape, rng, 0.5), randn({D}, rng, 0.5), randn(shape, rng)};
}

// Forward and both gradients of one backend, for loss = <dy, y>. The inputs are used as they are (no copy), so a
// misaligned view stays misaligned.
struct RmsNormRun {
  at::Tensor y, dx, dweight;
};

RmsNormRun run(Backend backend, at::Tensor const& x0, at::Tensor const& w0, at::Tensor const& dy) {
  at::Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
  at::Tensor y = ops::rmsnorm(x, w, kEps, backend);
  auto grads = torch::autograd::grad({y}, {x, w}, {dy});
  return {y.detach(), grads[0], grads[1]};
}

TEST(RmsNormComposite, MatchesReferenceOnCpuInFp64) {
  auto rng = test_rng();
  RmsNormInputs const in = draw({3, 4, 19}, rng);
  at::Device const cpu(at::kCPU);
  RmsNormRun const r = run(Backend::kComposite, to_torch(in.x, at::kDouble, cpu), to_torch(in.weight, at::kDouble, cpu),
                           to_torch(in.dy, at::kDouble, cpu));
  ref::RmsNormGrads const g = ref::rmsnorm_bwd(in.dy, in.x, in.weight, kEps);
  // The same fp64 formulas in different orders (autograd's dx vs the closed form): 1e-12 relative covers that.
  Tolerance const tol{1e-13, 1e-12};
  FUSEPACK_EXPECT_PASS(compare_allclose("y", to_ref(r.y), ref::rmsnorm_fwd(in.x, in.weight, kEps), tol));
  FUSEPACK_EXPECT_PASS(compare_allclose("dx", to_ref(r.dx), g.dx, tol));
  FUSEPACK_EXPECT_PASS(compare_allclose("dweight", to_ref(r.dweight), g.dweight, tol));
}

// The row layout of both norm kernels (plain C++, checked on the CPU): every D in 1..kNormMaxDim is covered by the
// threads of its row, with the register and block-size budgets the kernels are compiled for (norm_rows.cuh).
TEST(RmsNormLayout, CoversEveryRowLengthWithinTheKernelBudgets) {
  for (int elem_bytes : {2, 4}) {
    for (bool vec_ok : {true, false}) {
      for (int small_row_iters : {1, 2, 4}) {
        for (int64_t dim = 1; dim <= kNormMaxDim; ++dim) {
          NormRowLayout const l = norm_row_layout(dim, elem_bytes, vec_ok, small_row_iters);
          std::string const where = "dim " + std::to_string(dim) + ", " + std::to_string(elem_bytes) +
                                    "-byte, vec_ok " + std::to_string(vec_ok) + ", small_row_iters " +
                                    std::to_string(small_row_iters);
          ASSERT_TRUE(l.supported) << where;
          ASSERT_EQ(l.vec, vec_ok && dim % (16 / elem_bytes) == 0) << where;
          ASSERT_EQ(l.chunks * l.elems, dim) << where;
          ASSERT_TRUE(l.iters == 1 || l.iters == 2 || l.iters == 4 || l.iters == 8) << where;
          ASSERT_GE(int64_t(l.lanes) * l.iters, l.chunks) << where;   // every access has a thread
          if (l.iters > 1) {
            ASSERT_LT(int64_t(l.lanes) * (l.iters / 2), l.chunks) << where;  // and no pass of idle threads
          }
          if (l.block_per_row) {
            ASSERT_EQ(l.lanes, l.threads) << where;
            ASSERT_EQ(l.threads % 32, 0) << where;
            // 1024 threads only with <= 8 elements per thread (kNormMaxThreads), else <= 256 and <= 32 elements.
            bool const wide = l.elems == 1 && l.iters >= 4;
            ASSERT_LE(l.threads, wide ? 1024 : 256) << where;
            ASSERT_LE(l.iters * l.elems, wide ? 8 : 32) << where;
          } else {
            ASSERT_TRUE(l.lanes == 4 || l.lanes == 8 || l.lanes == 16 || l.lanes == 32) << where;
            ASSERT_EQ(l.threads, 256) << where;
            ASSERT_LE(l.iters, 4) << where;
          }
        }
      }
    }
  }
  EXPECT_FALSE(norm_row_layout(0, 2, true, 1).supported);
  EXPECT_FALSE(norm_row_layout(kNormMaxDim + 1, 2, true, 1).supported);
  // The Qwen3.5-27B shapes (bf16): q/k norm and layer norm, forward and backward.
  NormRowLayout const qk_fwd = norm_row_layout(256, 2, true, 4), qk_bwd = norm_row_layout(256, 2, true, 1),
                      layer = norm_row_layout(5120, 2, true, 1);
  EXPECT_EQ(qk_fwd.lanes, 8);
  EXPECT_EQ(qk_fwd.iters, 4);
  EXPECT_EQ(qk_bwd.lanes, 32);
  EXPECT_EQ(qk_bwd.iters, 1);
  EXPECT_TRUE(layer.block_per_row);
  EXPECT_EQ(layer.threads, 160);
  EXPECT_EQ(layer.iters, 4);
}

// The fused result in `dtype` against the reference, with the composite in the same dtype as baseline. `place`
// turns the rounded inputs into the tensors the backends see (contiguous CUDA tensors, or misaligned views).
template <typename Place>
void expect_fused_matches_reference(Dtype dtype, ref::Shape const& shape, Place&& place) {
  auto rng = test_rng();
  RmsNormInputs in = draw(shape, rng);
  for (Tensor* t : {&in.x, &in.weight, &in.dy}) round_to(dtype, *t);  // the reference sees the kernel's inputs
  at::ScalarType const st = scalar_type(dtype);
  at::Tensor const x = place(in.x, st), w = place(in.weight, st), dy = place(in.dy, st);
  RmsNormRun const fused = run(Backend::kFused, x, w, dy), composite = run(Backend::kComposite, x, w, dy);
  ref::RmsNormGrads const want = ref::rmsnorm_bwd(in.dy, in.x, in.weight, kEps);
  FUSEPACK_EXPECT_PASS(check_fused("y", fused.y, composite.y, ref::rmsnorm_fwd(in.x, in.weight, kEps)));
  FUSEPACK_EXPECT_PASS(check_fused("dx", fused.dx, composite.dx, want.dx));
  FUSEPACK_EXPECT_PASS(check_fused("dweight", fused.dweight, composite.dweight, want.dweight));
}

at::Tensor on_cuda(Tensor const& t, at::ScalarType st) { return to_torch(t, st, at::Device(at::kCUDA)); }

class RmsNormFused : public ::testing::TestWithParam<std::tuple<Dtype, RmsNormShape>> {};

TEST_P(RmsNormFused, MatchesReference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto const [dtype, shape] = GetParam();
  expect_fused_matches_reference(dtype, shape.shape, on_cuda);
}

INSTANTIATE_TEST_SUITE_P(
    Sm90, RmsNormFused,
    ::testing::Combine(
        ::testing::Values(Dtype::kBF16, Dtype::kF16, Dtype::kF32),
        ::testing::Values(
            // Qwen3.5-27B: input/post-attention/final norms over hidden 5120 (one row per block).
            RmsNormShape{"layer_t1_d5120", {1, 5120}}, RmsNormShape{"layer_t37_d5120", {37, 5120}},
            RmsNormShape{"layer_t1000_d5120", {1000, 5120}},
            // q_norm over head_dim 256 (a warp per row in bf16, several rows per block).
            RmsNormShape{"qnorm_t1_h24_d256", {1, 24, 256}}, RmsNormShape{"qnorm_t37_h24_d256", {37, 24, 256}},
            RmsNormShape{"qnorm_t1000_h24_d256", {1000, 24, 256}},
            // k_norm: 4 kv heads.
            RmsNormShape{"knorm_t1_h4_d256", {1, 4, 256}}, RmsNormShape{"knorm_t37_h4_d256", {37, 4, 256}},
            RmsNormShape{"knorm_t1000_h4_d256", {1000, 4, 256}},
            // D not a multiple of 8: the scalar path, small (8 lanes per row) and large (one row per block).
            RmsNormShape{"odd_t37_d7", {37, 7}}, RmsNormShape{"odd_t37_d1003", {37, 1003}},
            RmsNormShape{"one_row_d7", {7}}, RmsNormShape{"one_row_d1003", {1003}},
            // Longest scalar rows (1024 threads × 8 elements) and the largest D the fused kernel takes.
            RmsNormShape{"odd_t3_d8191", {3, 8191}}, RmsNormShape{"max_t5_d8192", {5, 8192}},
            // A row of two 16-byte vectors (groups of 4 lanes, half idle) and a row of 128 bf16 vectors.
            RmsNormShape{"tail_t33_d16", {33, 16}}, RmsNormShape{"t17_d1024", {17, 1024}})),
    [](auto const& tc) { return std::string(dtype_name(std::get<0>(tc.param))) + "_" + std::get<1>(tc.param).name; });

// Every tensor one element past a 16-byte boundary: the kernels must take the scalar path and still be right.
TEST(RmsNormFused, MisalignedPointersTakeTheScalarPath) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto misaligned = [](Tensor const& t, at::ScalarType st) {
    at::Tensor const dense = on_cuda(t, st);
    at::Tensor buffer = at::empty({dense.numel() + 1}, dense.options());
    at::Tensor view = buffer.narrow(0, 1, dense.numel()).view(dense.sizes());
    view.copy_(dense);
    EXPECT_TRUE(view.is_contiguous());
    EXPECT_NE(reinterpret_cast<std::uintptr_t>(view.data_ptr()) % 16, 0u);
    return view;
  };
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16, Dtype::kF32}) {
    expect_fused_matches_reference(dtype, {37, 24, 256}, misaligned);
    expect_fused_matches_reference(dtype, {5, 5120}, misaligned);
  }
}

TEST(RmsNormFused, BackwardIsBitwiseDeterministic) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  for (ref::Shape const& shape : {ref::Shape{1000, 5120}, ref::Shape{1000, 24, 256}, ref::Shape{129, 1003}}) {
    RmsNormInputs const in = draw(shape, rng);
    at::Tensor const x = on_cuda(in.x, at::kBFloat16), w = on_cuda(in.weight, at::kBFloat16),
                     dy = on_cuda(in.dy, at::kBFloat16);
    RmsNormRun const a = run(Backend::kFused, x, w, dy), b = run(Backend::kFused, x, w, dy);
    EXPECT_TRUE(at::equal(a.y, b.y)) << ref::shape_str(shape);
    EXPECT_TRUE(at::equal(a.dx, b.dx)) << ref::shape_str(shape);
    EXPECT_TRUE(at::equal(a.dweight, b.dweight)) << ref::shape_str(shape);
  }
}

// T = 0: nothing to normalise; the weight gradient is an exact zero (the backward still runs its reduction).
TEST(RmsNormFused, EmptyBatchGivesEmptyOutputsAndZeroWeightGradient) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  RmsNormRun const r = run(Backend::kFused, at::ones({0, 24, 256}, opts), at::ones({256}, opts),
                           at::ones({0, 24, 256}, opts));
  EXPECT_EQ(r.y.sizes(), at::IntArrayRef({0, 24, 256}));
  EXPECT_EQ(r.dx.sizes(), at::IntArrayRef({0, 24, 256}));
  EXPECT_TRUE(at::equal(r.dweight, at::zeros({256}, opts)));
}

// T = 0 at the layer-norm width: the one-row-per-block layout sizes its dweight workspace for no rows (the test above
// covers the several-rows-per-block q/k-norm layout).
TEST(RmsNormFused, EmptyBatchOfLayerNormRowsGivesZeroWeightGradient) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const empty = at::ones({0, 5120}, opts);
  RmsNormRun const r = run(Backend::kFused, empty, at::ones({5120}, opts), empty);
  EXPECT_EQ(r.y.sizes(), at::IntArrayRef({0, 5120}));
  EXPECT_EQ(r.dx.sizes(), at::IntArrayRef({0, 5120}));
  EXPECT_TRUE(at::equal(r.dweight, at::zeros({5120}, opts)));
}

TEST(RmsNormFused, RejectsRowsLongerThanTheRegisterBudget) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const x = at::ones({2, 8193}, opts), w = at::zeros({8193}, opts);
  expect_torch_error([&] { ops::rmsnorm(x, w, kEps, Backend::kFused); }, "supports 1 <= D <= 8192");
}

TEST(RmsNormOps, RejectsBadInput) {
  at::Tensor const x = at::ones({2, 4}), w = at::zeros({4});
  expect_torch_error([&] { ops::rmsnorm(x, at::zeros({5}), kEps, Backend::kComposite); },
                     "rmsnorm: weight has shape [5]; expected 4 in dimension 0");
  expect_torch_error([&] { ops::rmsnorm(x, at::zeros({1, 4}), kEps, Backend::kComposite); },
                     "rmsnorm: weight must have 1 dimensions");
  expect_torch_error([&] { ops::rmsnorm(x, w, 0.0, Backend::kComposite); }, "rmsnorm: eps must be > 0; got 0");
  expect_torch_error([&] { ops::rmsnorm(x, w, -1e-6, Backend::kFused); }, "rmsnorm: eps must be > 0");
  expect_torch_error([&] { ops::rmsnorm(x, w.to(at::kDouble), kEps, Backend::kComposite); },
                     "rmsnorm: weight has dtype Double but x has Float");
  expect_torch_error([&] { ops::rmsnorm(at::ones({}), at::zeros({1}), kEps, Backend::kComposite); },
                     "rmsnorm: x must be [..., D] with at least 1 dimension");
  // The fused backend never falls back: CPU tensors are refused with the reason (no device, or no CUDA build).
  try {
    ops::rmsnorm(x, w, kEps, Backend::kFused);
    ADD_FAILURE() << "the fused backend accepted CPU tensors";
  } catch (c10::Error const& e) {
    std::string const msg = e.what_without_backtrace();
    std::printf("[  error   ] %s\n", msg.c_str());
    EXPECT_TRUE(msg.find("rmsnorm: the fused kernel needs x on a CUDA device") != std::string::npos ||
                msg.find("has no CUDA kernels") != std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace fusepack::test
