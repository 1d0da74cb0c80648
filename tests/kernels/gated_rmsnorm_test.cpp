// gated_rmsnorm on both backends: the fused kernels against the fp64 reference under docs/contracts.md, numerics, with
// the composite in the same dtype as baseline (suites *Fused*: labels kernels + gpu), forward and all three gradients,
// at the Qwen3.5-27B GDN output-norm shape [T, 48, 128] and odd ones (D = 7, 1003, 8191, 5120, one row, misaligned
// pointers); the composite on the CPU against the reference in fp64; determinism; bad input.
#include "kernels/ops/gated_rmsnorm.h"
#include "reference/gated_rmsnorm.h"

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

struct GatedRmsNormShape {
  std::string name;
  ref::Shape shape;  // x and z: [..., D]
};

struct GatedRmsNormInputs {
  Tensor x, z, weight, dy;
};

// x rows away from zero (the norm's derivatives grow like 1/|x| near 0), a gate z spread over silu's bend, w near
// its initial ones, and dy.
GatedRmsNormInputs draw(ref::Shape const& shape, std::mt19937_64& rng) {
  ref::Index const D = shape.back();
  Tensor weight = randn({D}, rng, 0.2);
  weight.flat().array() += 1.0;
  return {randn_rows_away_from_zero(shape, rng, 0.5), randn(shape, rng, 2.0), weight, randn(shape, rng)};
}

// Forward and the three gradients of one backend, for loss = <dy, y>. The inputs are used as they are (no copy), so
// a misaligned view stays misaligned.
struct GatedRmsNormRun {
  at::Tensor y, dx, dz, dweight;
};

GatedRmsNormRun run(Backend backend, at::Tensor const& x0, at::Tensor const& z0, at::Tensor const& w0,
                    at::Tensor const& dy) {
  at::Tensor x = x0.detach().requires_grad_(), z = z0.detach().requires_grad_(), w = w0.detach().requires_grad_();
  at::Tensor y = ops::gated_rmsnorm(x, z, w, kEps, backend);
  auto grads = torch::autograd::grad({y}, {x, z, w}, {dy});
  return {y.detach(), grads[0], grads[1], grads[2]};
}

TEST(GatedRmsNormComposite, MatchesReferenceOnCpuInFp64) {
  auto rng = test_rng();
  GatedRmsNormInputs const in = draw({3, 4, 19}, rng);
  at::Device const cpu(at::kCPU);
  GatedRmsNormRun const r =
      run(Backend::kComposite, to_torch(in.x, at::kDouble, cpu), to_torch(in.z, at::kDouble, cpu),
          to_torch(in.weight, at::kDouble, cpu), to_torch(in.dy, at::kDouble, cpu));
  ref::GatedRmsNormGrads const g = ref::gated_rmsnorm_bwd(in.dy, in.x, in.z, in.weight, kEps);
  // The same fp64 formulas in different orders (autograd's dx vs the closed form): 1e-12 relative covers that.
  Tolerance const tol{1e-13, 1e-12};
  FUSEPACK_EXPECT_PASS(compare_allclose("y", to_ref(r.y), ref::gated_rmsnorm_fwd(in.x, in.z, in.weight, kEps), tol));
  FUSEPACK_EXPECT_PASS(compare_allclose("dx", to_ref(r.dx), g.dx, tol));
  FUSEPACK_EXPECT_PASS(compare_allclose("dz", to_ref(r.dz), g.dz, tol));
  FUSEPACK_EXPECT_PASS(compare_allclose("dweight", to_ref(r.dweight), g.dweight, tol));
}

// The fused result in `dtype` against the reference, with the composite in the same dtype as baseline. `place`
// turns the rounded inputs into the tensors the backends see (contiguous CUDA tensors, or misaligned views).
template <typename Place>
void expect_fused_matches_reference(Dtype dtype, ref::Shape const& shape, Place&& place) {
  auto rng = test_rng();
  GatedRmsNormInputs in = draw(shape, rng);
  for (Tensor* t : {&in.x, &in.z, &in.weight, &in.dy}) round_to(dtype, *t);  // the reference sees the kernel's inputs
  at::ScalarType const st = scalar_type(dtype);
  at::Tensor const x = place(in.x, st), z = place(in.z, st), w = place(in.weight, st), dy = place(in.dy, st);
  GatedRmsNormRun const fused = run(Backend::kFused, x, z, w, dy), composite = run(Backend::kComposite, x, z, w, dy);
  ref::GatedRmsNormGrads const want = ref::gated_rmsnorm_bwd(in.dy, in.x, in.z, in.weight, kEps);
  FUSEPACK_EXPECT_PASS(check_fused("y", fused.y, composite.y, ref::gated_rmsnorm_fwd(in.x, in.z, in.weight, kEps)));
  FUSEPACK_EXPECT_PASS(check_fused("dx", fused.dx, composite.dx, want.dx));
  FUSEPACK_EXPECT_PASS(check_fused("dz", fused.dz, composite.dz, want.dz));
  FUSEPACK_EXPECT_PASS(check_fused("dweight", fused.dweight, composite.dweight, want.dweight));
}

at::Tensor on_cuda(Tensor const& t, at::ScalarType st) { return to_torch(t, st, at::Device(at::kCUDA)); }

class GatedRmsNormFused : public ::testing::TestWithParam<std::tuple<Dtype, GatedRmsNormShape>> {};

TEST_P(GatedRmsNormFused, MatchesReference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto const [dtype, shape] = GetParam();
  expect_fused_matches_reference(dtype, shape.shape, on_cuda);
}

INSTANTIATE_TEST_SUITE_P(
    Sm90, GatedRmsNormFused,
    ::testing::Combine(
        ::testing::Values(Dtype::kBF16, Dtype::kF16, Dtype::kF32),
        ::testing::Values(
            // Qwen3.5-27B GDN output norm: 48 value heads of head_v_dim 128 (half a warp per row in bf16).
            GatedRmsNormShape{"gdn_t1_h48_d128", {1, 48, 128}}, GatedRmsNormShape{"gdn_t37_h48_d128", {37, 48, 128}},
            GatedRmsNormShape{"gdn_t1000_h48_d128", {1000, 48, 128}},
            // D not a multiple of 8: the scalar path, small (8 lanes per row) and large (one row per block).
            GatedRmsNormShape{"odd_t37_d7", {37, 7}}, GatedRmsNormShape{"odd_t37_d1003", {37, 1003}},
            GatedRmsNormShape{"one_row_d7", {7}}, GatedRmsNormShape{"one_row_d128", {128}},
            // One row per block with 16-byte accesses, the longest scalar rows, the largest D.
            GatedRmsNormShape{"t37_d5120", {37, 5120}}, GatedRmsNormShape{"odd_t3_d8191", {3, 8191}},
            GatedRmsNormShape{"max_t5_d8192", {5, 8192}})),
    [](auto const& tc) { return std::string(dtype_name(std::get<0>(tc.param))) + "_" + std::get<1>(tc.param).name; });

// Every tensor one element past a 16-byte boundary: the kernels must take the scalar path and still be right.
TEST(GatedRmsNormFused, MisalignedPointersTakeTheScalarPath) {
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
    expect_fused_matches_reference(dtype, {37, 48, 128}, misaligned);
  }
}

TEST(GatedRmsNormFused, BackwardIsBitwiseDeterministic) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  for (ref::Shape const& shape : {ref::Shape{1000, 48, 128}, ref::Shape{129, 1003}, ref::Shape{300, 5120}}) {
    GatedRmsNormInputs const in = draw(shape, rng);
    at::Tensor const x = on_cuda(in.x, at::kBFloat16), z = on_cuda(in.z, at::kBFloat16),
                     w = on_cuda(in.weight, at::kBFloat16), dy = on_cuda(in.dy, at::kBFloat16);
    GatedRmsNormRun const a = run(Backend::kFused, x, z, w, dy), b = run(Backend::kFused, x, z, w, dy);
    EXPECT_TRUE(at::equal(a.y, b.y)) << ref::shape_str(shape);
    EXPECT_TRUE(at::equal(a.dx, b.dx)) << ref::shape_str(shape);
    EXPECT_TRUE(at::equal(a.dz, b.dz)) << ref::shape_str(shape);
    EXPECT_TRUE(at::equal(a.dweight, b.dweight)) << ref::shape_str(shape);
  }
}

// T = 0: nothing to normalise; the weight gradient is an exact zero (the backward still runs its reduction).
TEST(GatedRmsNormFused, EmptyBatchGivesEmptyOutputsAndZeroWeightGradient) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const empty = at::ones({0, 48, 128}, opts);
  GatedRmsNormRun const r = run(Backend::kFused, empty, empty, at::ones({128}, opts), empty);
  EXPECT_EQ(r.y.sizes(), at::IntArrayRef({0, 48, 128}));
  EXPECT_EQ(r.dx.sizes(), at::IntArrayRef({0, 48, 128}));
  EXPECT_EQ(r.dz.sizes(), at::IntArrayRef({0, 48, 128}));
  EXPECT_TRUE(at::equal(r.dweight, at::zeros({128}, opts)));
}

// T = 0 at D = 5120: the one-row-per-block layout sizes its dweight workspace for no rows (the test above covers the
// several-rows-per-block GDN layout).
TEST(GatedRmsNormFused, EmptyBatchOfLongRowsGivesZeroWeightGradient) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const empty = at::ones({0, 5120}, opts);
  GatedRmsNormRun const r = run(Backend::kFused, empty, empty, at::ones({5120}, opts), empty);
  EXPECT_EQ(r.y.sizes(), at::IntArrayRef({0, 5120}));
  EXPECT_EQ(r.dx.sizes(), at::IntArrayRef({0, 5120}));
  EXPECT_EQ(r.dz.sizes(), at::IntArrayRef({0, 5120}));
  EXPECT_TRUE(at::equal(r.dweight, at::zeros({5120}, opts)));
}

TEST(GatedRmsNormFused, RejectsRowsLongerThanTheRegisterBudget) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const x = at::ones({2, 8193}, opts), w = at::ones({8193}, opts);
  expect_torch_error([&] { ops::gated_rmsnorm(x, x, w, kEps, Backend::kFused); }, "supports 1 <= D <= 8192");
}

TEST(GatedRmsNormOps, RejectsBadInput) {
  at::Tensor const x = at::ones({2, 4}), z = at::ones({2, 4}), w = at::ones({4});
  expect_torch_error([&] { ops::gated_rmsnorm(x, at::ones({2, 3}), w, kEps, Backend::kComposite); },
                     "gated_rmsnorm: z has shape [2, 3] but x has [2, 4]; they must match");
  expect_torch_error([&] { ops::gated_rmsnorm(x, z, at::ones({5}), kEps, Backend::kComposite); },
                     "gated_rmsnorm: weight has shape [5]; expected 4 in dimension 0");
  expect_torch_error([&] { ops::gated_rmsnorm(x, z, w, 0.0, Backend::kComposite); },
                     "gated_rmsnorm: eps must be > 0; got 0");
  expect_torch_error([&] { ops::gated_rmsnorm(x, z, w, -1.0, Backend::kFused); }, "gated_rmsnorm: eps must be > 0");
  expect_torch_error([&] { ops::gated_rmsnorm(x, z.to(at::kBFloat16), w, kEps, Backend::kComposite); },
                     "gated_rmsnorm: z has dtype BFloat16 but x has Float");
  expect_torch_error([&] { ops::gated_rmsnorm(x, z, w.to(at::kDouble), kEps, Backend::kComposite); },
                     "gated_rmsnorm: weight has dtype Double but x has Float");
  expect_torch_error([&] { ops::gated_rmsnorm(x, at::Tensor(), w, kEps, Backend::kComposite); },
                     "gated_rmsnorm: z is required");
  // The fused backend never falls back: CPU tensors are refused with the reason (no device, or no CUDA build).
  try {
    ops::gated_rmsnorm(x, z, w, kEps, Backend::kFused);
    ADD_FAILURE() << "the fused backend accepted CPU tensors";
  } catch (c10::Error const& e) {
    std::string const msg = e.what_without_backtrace();
    std::printf("[  error   ] %s\n", msg.c_str());
    EXPECT_TRUE(msg.find("gated_rmsnorm: the fused kernel needs x on a CUDA device") != std::string::npos ||
                msg.find("has no CUDA kernels") != std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace fusepack::test
