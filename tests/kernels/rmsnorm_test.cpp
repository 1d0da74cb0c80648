// rmsnorm and gated_rmsnorm (one kernel family, kernels/rmsnorm/) on both backends: the fused kernels against the
// fp64 reference under docs/contracts.md, numerics, with the composite in the same dtype as baseline (suites *Fused*:
// labels kernels + gpu), forward and every gradient, at the Qwen3.5-27B shapes (layer norms [T, 5120], q/k norms
// [T, 24|4, 256], the GDN output norm [T, 48, 128]) and odd ones (D = 7, 1003, 8191, one row, misaligned pointers);
// the composites on the CPU against the references in fp64; the row layout; determinism; bad input.
#include "kernels/ops/rmsnorm.h"
#include "kernels/rmsnorm/norm_layout.h"
#ifdef FUSEPACK_TEST_CUDA_KERNELS
#include "kernels/rmsnorm/rmsnorm.h"
#endif
#include "reference/gated_rmsnorm.h"
#include "reference/rmsnorm.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/torch_bridge.h"
#include "verify/random.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

namespace fusepack::test {
namespace {

using ops::Backend;
using ref::Tensor;

constexpr double kEps = 1e-6;  // rms_norm_eps of every released Qwen3.5 checkpoint

// The two forms of the op: plain (rmsnorm, gain 1 + w) and gated (gated_rmsnorm, gain w, times silu(z)).
enum class Form { kPlain, kGated };

char const* op_name(Form form) { return form == Form::kGated ? "gated_rmsnorm" : "rmsnorm"; }

struct NormShape {
  std::string name;
  ref::Shape shape;  // x (and z): [..., D]
};

struct NormInputs {
  Tensor x, z, weight, dy;  // z undefined in the plain form
};

// x rows away from zero (the norm's derivatives grow like 1/|x| near 0) and dy; plain: the checkpoint's w (gain
// 1 + w); gated: w near its initial ones and a gate z spread over silu's bend.
NormInputs draw(Form form, ref::Shape const& shape, std::mt19937_64& rng) {
  ref::Index const D = shape.back();
  if (form == Form::kPlain) return {randn_rows_away_from_zero(shape, rng, 0.5), Tensor(), randn({D}, rng, 0.5),
                                    randn(shape, rng)};
  Tensor weight = randn({D}, rng, 0.2);
  weight.flat().array() += 1.0;
  return {randn_rows_away_from_zero(shape, rng, 0.5), randn(shape, rng, 2.0), weight, randn(shape, rng)};
}

// Forward and the gradients of one backend, for loss = <dy, y>; dz undefined in the plain form. The inputs are used
// as they are (no copy), so a misaligned view stays misaligned.
struct NormRun {
  at::Tensor y, dx, dz, dweight;
};

NormRun run(Backend backend, at::Tensor const& x0, at::Tensor const& z0, at::Tensor const& w0, at::Tensor const& dy) {
  at::Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
  if (!z0.defined()) {
    at::Tensor y = ops::rmsnorm(x, w, kEps, backend);
    auto grads = torch::autograd::grad({y}, {x, w}, {dy});
    return {y.detach(), grads[0], at::Tensor(), grads[1]};
  }
  at::Tensor z = z0.detach().requires_grad_();
  at::Tensor y = ops::gated_rmsnorm(x, z, w, kEps, backend);
  auto grads = torch::autograd::grad({y}, {x, z, w}, {dy});
  return {y.detach(), grads[0], grads[1], grads[2]};
}

// The fp64 reference's forward and gradients; dz undefined in the plain form.
struct NormRef {
  Tensor y, dx, dz, dweight;
};

NormRef reference(NormInputs const& in) {
  if (!in.z.defined()) {
    ref::RmsNormGrads const g = ref::rmsnorm_bwd(in.dy, in.x, in.weight, kEps);
    return {ref::rmsnorm_fwd(in.x, in.weight, kEps), g.dx, Tensor(), g.dweight};
  }
  ref::GatedRmsNormGrads const g = ref::gated_rmsnorm_bwd(in.dy, in.x, in.z, in.weight, kEps);
  return {ref::gated_rmsnorm_fwd(in.x, in.z, in.weight, kEps), g.dx, g.dz, g.dweight};
}

// The composite on the CPU in fp64 against the reference.
void expect_composite_matches_reference_in_fp64(Form form) {
  auto rng = test_rng();
  NormInputs const in = draw(form, {3, 4, 19}, rng);
  at::Device const cpu(at::kCPU);
  auto on_cpu = [&](Tensor const& t) { return t.defined() ? to_torch(t, at::kDouble, cpu) : at::Tensor(); };
  NormRun const r = run(Backend::kComposite, on_cpu(in.x), on_cpu(in.z), on_cpu(in.weight), on_cpu(in.dy));
  NormRef const want = reference(in);
  // The same fp64 formulas in different orders (autograd's dx vs the closed form): 1e-12 relative covers that.
  Tolerance const tol{1e-13, 1e-12};
  FUSEPACK_EXPECT_PASS(compare_allclose("y", to_ref(r.y), want.y, tol));
  FUSEPACK_EXPECT_PASS(compare_allclose("dx", to_ref(r.dx), want.dx, tol));
  if (form == Form::kGated) FUSEPACK_EXPECT_PASS(compare_allclose("dz", to_ref(r.dz), want.dz, tol));
  FUSEPACK_EXPECT_PASS(compare_allclose("dweight", to_ref(r.dweight), want.dweight, tol));
}

TEST(RmsNormComposite, MatchesReferenceOnCpuInFp64) { expect_composite_matches_reference_in_fp64(Form::kPlain); }

TEST(GatedRmsNormComposite, MatchesReferenceOnCpuInFp64) { expect_composite_matches_reference_in_fp64(Form::kGated); }

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
void expect_fused_matches_reference(Form form, Dtype dtype, ref::Shape const& shape, Place&& place) {
  auto rng = test_rng();
  NormInputs in = draw(form, shape, rng);
  for (Tensor* t : {&in.x, &in.z, &in.weight, &in.dy}) {
    if (t->defined()) round_to(dtype, *t);  // the reference sees the kernel's inputs
  }
  at::ScalarType const st = scalar_type(dtype);
  at::Tensor const x = place(in.x, st), z = in.z.defined() ? place(in.z, st) : at::Tensor(), w = place(in.weight, st),
                   dy = place(in.dy, st);
  NormRun const fused = run(Backend::kFused, x, z, w, dy), composite = run(Backend::kComposite, x, z, w, dy);
  NormRef const want = reference(in);
  FUSEPACK_EXPECT_PASS(check_fused("y", fused.y, composite.y, want.y));
  FUSEPACK_EXPECT_PASS(check_fused("dx", fused.dx, composite.dx, want.dx));
  if (form == Form::kGated) FUSEPACK_EXPECT_PASS(check_fused("dz", fused.dz, composite.dz, want.dz));
  FUSEPACK_EXPECT_PASS(check_fused("dweight", fused.dweight, composite.dweight, want.dweight));
}

at::Tensor on_cuda(Tensor const& t, at::ScalarType st) { return to_torch(t, st, at::Device(at::kCUDA)); }

std::string case_name(std::tuple<Dtype, NormShape> const& param) {
  return std::string(dtype_name(std::get<0>(param))) + "_" + std::get<1>(param).name;
}

class RmsNormFused : public ::testing::TestWithParam<std::tuple<Dtype, NormShape>> {};

TEST_P(RmsNormFused, MatchesReference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto const [dtype, shape] = GetParam();
  expect_fused_matches_reference(Form::kPlain, dtype, shape.shape, on_cuda);
}

INSTANTIATE_TEST_SUITE_P(
    Sm90, RmsNormFused,
    ::testing::Combine(
        ::testing::Values(Dtype::kBF16, Dtype::kF16, Dtype::kF32),
        ::testing::Values(
            // Qwen3.5-27B: input/post-attention/final norms over hidden 5120 (one row per block).
            NormShape{"layer_t1_d5120", {1, 5120}}, NormShape{"layer_t37_d5120", {37, 5120}},
            NormShape{"layer_t1000_d5120", {1000, 5120}},
            // q_norm over head_dim 256 (a warp per row in bf16, several rows per block).
            NormShape{"qnorm_t1_h24_d256", {1, 24, 256}}, NormShape{"qnorm_t37_h24_d256", {37, 24, 256}},
            NormShape{"qnorm_t1000_h24_d256", {1000, 24, 256}},
            // k_norm: 4 kv heads.
            NormShape{"knorm_t1_h4_d256", {1, 4, 256}}, NormShape{"knorm_t37_h4_d256", {37, 4, 256}},
            NormShape{"knorm_t1000_h4_d256", {1000, 4, 256}},
            // D not a multiple of 8: the scalar path, small (8 lanes per row) and large (one row per block).
            NormShape{"odd_t37_d7", {37, 7}}, NormShape{"odd_t37_d1003", {37, 1003}}, NormShape{"one_row_d7", {7}},
            NormShape{"one_row_d1003", {1003}},
            // Longest scalar rows (1024 threads × 8 elements) and the largest D the fused kernel takes.
            NormShape{"odd_t3_d8191", {3, 8191}}, NormShape{"max_t5_d8192", {5, 8192}},
            // A row of two 16-byte vectors (groups of 4 lanes, half idle) and a row of 128 bf16 vectors.
            NormShape{"tail_t33_d16", {33, 16}}, NormShape{"t17_d1024", {17, 1024}})),
    [](auto const& tc) { return case_name(tc.param); });

class GatedRmsNormFused : public ::testing::TestWithParam<std::tuple<Dtype, NormShape>> {};

TEST_P(GatedRmsNormFused, MatchesReference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto const [dtype, shape] = GetParam();
  expect_fused_matches_reference(Form::kGated, dtype, shape.shape, on_cuda);
}

INSTANTIATE_TEST_SUITE_P(
    Sm90, GatedRmsNormFused,
    ::testing::Combine(
        ::testing::Values(Dtype::kBF16, Dtype::kF16, Dtype::kF32),
        ::testing::Values(
            // Qwen3.5-27B GDN output norm: 48 value heads of head_v_dim 128 (half a warp per row in bf16).
            NormShape{"gdn_t1_h48_d128", {1, 48, 128}}, NormShape{"gdn_t37_h48_d128", {37, 48, 128}},
            NormShape{"gdn_t1000_h48_d128", {1000, 48, 128}},
            // D not a multiple of 8: the scalar path, small (8 lanes per row) and large (one row per block).
            NormShape{"odd_t37_d7", {37, 7}}, NormShape{"odd_t37_d1003", {37, 1003}}, NormShape{"one_row_d7", {7}},
            NormShape{"one_row_d128", {128}},
            // One row per block with 16-byte accesses, the longest scalar rows, the largest D.
            NormShape{"t37_d5120", {37, 5120}}, NormShape{"odd_t3_d8191", {3, 8191}},
            NormShape{"max_t5_d8192", {5, 8192}})),
    [](auto const& tc) { return case_name(tc.param); });

// Every tensor one element past a 16-byte boundary: the kernels must take the scalar path and still be right.
void expect_misaligned_pointers_take_the_scalar_path(Form form, std::vector<ref::Shape> const& shapes) {
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
    for (ref::Shape const& shape : shapes) expect_fused_matches_reference(form, dtype, shape, misaligned);
  }
}

TEST(RmsNormFused, MisalignedPointersTakeTheScalarPath) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_misaligned_pointers_take_the_scalar_path(Form::kPlain, {{37, 24, 256}, {5, 5120}});
}

TEST(GatedRmsNormFused, MisalignedPointersTakeTheScalarPath) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_misaligned_pointers_take_the_scalar_path(Form::kGated, {{37, 48, 128}});
}

void expect_backward_bitwise_deterministic(Form form, std::vector<ref::Shape> const& shapes) {
  auto rng = test_rng();
  for (ref::Shape const& shape : shapes) {
    NormInputs const in = draw(form, shape, rng);
    at::Tensor const x = on_cuda(in.x, at::kBFloat16), w = on_cuda(in.weight, at::kBFloat16),
                     dy = on_cuda(in.dy, at::kBFloat16);
    at::Tensor const z = in.z.defined() ? on_cuda(in.z, at::kBFloat16) : at::Tensor();
    NormRun const a = run(Backend::kFused, x, z, w, dy), b = run(Backend::kFused, x, z, w, dy);
    EXPECT_TRUE(at::equal(a.y, b.y)) << ref::shape_str(shape);
    EXPECT_TRUE(at::equal(a.dx, b.dx)) << ref::shape_str(shape);
    if (form == Form::kGated) {
      EXPECT_TRUE(at::equal(a.dz, b.dz)) << ref::shape_str(shape);
    }
    EXPECT_TRUE(at::equal(a.dweight, b.dweight)) << ref::shape_str(shape);
  }
}

TEST(RmsNormFused, BackwardIsBitwiseDeterministic) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_backward_bitwise_deterministic(Form::kPlain, {{1000, 5120}, {1000, 24, 256}, {129, 1003}});
}

TEST(GatedRmsNormFused, BackwardIsBitwiseDeterministic) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_backward_bitwise_deterministic(Form::kGated, {{1000, 48, 128}, {129, 1003}, {300, 5120}});
}

// T = 0: nothing to normalise; the weight gradient is an exact zero (the backward still runs its reduction).
void expect_empty_batch_gives_zero_weight_gradient(Form form, std::vector<int64_t> const& shape) {
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const empty = at::ones(shape, opts), w = at::ones({shape.back()}, opts);
  NormRun const r = run(Backend::kFused, empty, form == Form::kGated ? empty : at::Tensor(), w, empty);
  EXPECT_EQ(r.y.sizes(), at::IntArrayRef(shape));
  EXPECT_EQ(r.dx.sizes(), at::IntArrayRef(shape));
  if (form == Form::kGated) {
    EXPECT_EQ(r.dz.sizes(), at::IntArrayRef(shape));
  }
  EXPECT_TRUE(at::equal(r.dweight, at::zeros({shape.back()}, opts)));
}

TEST(RmsNormFused, EmptyBatchGivesEmptyOutputsAndZeroWeightGradient) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_empty_batch_gives_zero_weight_gradient(Form::kPlain, {0, 24, 256});
}

TEST(GatedRmsNormFused, EmptyBatchGivesEmptyOutputsAndZeroWeightGradient) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_empty_batch_gives_zero_weight_gradient(Form::kGated, {0, 48, 128});
}

// T = 0 at D = 5120: the one-row-per-block layout sizes its dweight workspace for no rows (the tests above cover the
// several-rows-per-block layouts).
TEST(RmsNormFused, EmptyBatchOfLayerNormRowsGivesZeroWeightGradient) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_empty_batch_gives_zero_weight_gradient(Form::kPlain, {0, 5120});
}

TEST(GatedRmsNormFused, EmptyBatchOfLongRowsGivesZeroWeightGradient) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_empty_batch_gives_zero_weight_gradient(Form::kGated, {0, 5120});
}

TEST(RmsNormFused, RejectsRowsLongerThanTheRegisterBudget) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const x = at::ones({2, 8193}, opts), w = at::zeros({8193}, opts);
  expect_torch_error([&] { ops::rmsnorm(x, w, kEps, Backend::kFused); }, "supports 1 <= D <= 8192");
  expect_torch_error([&] { ops::gated_rmsnorm(x, x, w, kEps, Backend::kFused); }, "supports 1 <= D <= 8192");
}

// The fused backend never falls back: CPU tensors are refused with the reason (no device, or no CUDA build).
template <typename F>
void expect_fused_refuses_cpu_tensors(Form form, F&& fused_call) {
  try {
    fused_call();
    ADD_FAILURE() << "the fused backend accepted CPU tensors";
  } catch (c10::Error const& e) {
    std::string const msg = e.what_without_backtrace();
    std::printf("[  error   ] %s\n", msg.c_str());
    EXPECT_TRUE(msg.find(std::string(op_name(form)) + ": the fused kernel needs x on a CUDA device") !=
                    std::string::npos ||
                msg.find("has no CUDA kernels") != std::string::npos)
        << msg;
  }
}

#ifdef FUSEPACK_TEST_CUDA_KERNELS
// The kernel's own contract, below the ops layer: z selects the gated form, which writes dz, so a gated backward
// without dz is refused before anything is launched (it would otherwise write through a null pointer). Runs on any
// machine: the check comes before the first CUDA call.
TEST(RmsNormKernel, GatedBackwardWithoutDzIsRefused) {
  float buffer[4] = {};
  RmsNormBwdParams p;
  p.x = p.z = p.weight = p.dy = buffer;
  p.dx = p.dweight = buffer;
  p.rstd = buffer;
  p.rows = 1;
  p.dim = 4;
  p.dtype = DType::kF32;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(run_rmsnorm_bwd(p, nullptr),
                                   "gated_rmsnorm_bwd: the gated form (z given) writes dz");
}
#endif

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
  expect_fused_refuses_cpu_tensors(Form::kPlain, [&] { ops::rmsnorm(x, w, kEps, Backend::kFused); });
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
  expect_torch_error([&] { ops::gated_rmsnorm(at::ones({}), at::ones({}), at::ones({1}), kEps, Backend::kComposite); },
                     "gated_rmsnorm: x must be [..., D] with at least 1 dimension");
  expect_fused_refuses_cpu_tensors(Form::kGated, [&] { ops::gated_rmsnorm(x, z, w, kEps, Backend::kFused); });
}

}  // namespace
}  // namespace fusepack::test
