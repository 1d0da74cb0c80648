// conv1d on both backends: the fused kernel against the fp64 reference under docs/contracts.md, numerics, with the
// composite in the same dtype as baseline (suites *Fused*: labels kernels + gpu), forward and both gradients; the
// composite on the CPU against the reference in fp64 (x, weight and initial_state gradients); the no-leak perturbation
// property on the GPU; bitwise determinism of the fused backward; conv1d_parts against conv1d's columns; T = 0; bad
// input.
#include "kernels/ops/check.h"
#include "kernels/ops/conv1d.h"
#include "kernels/ops/host_to_device.h"
#include "reference/conv1d.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/torch_bridge.h"
#include "verify/random.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

namespace fusepack::test {
namespace {

using ops::Backend;
using ref::Tensor;

at::Tensor cu_tensor(std::vector<std::int32_t> const& cu, at::Device device) {
  return at::tensor(std::vector<int32_t>(cu.begin(), cu.end()), at::kInt).to(device);
}

// Forward and the gradients of one backend, for loss = <dy, y>. dinitial_state is defined only when a state is given.
struct Conv1dRun {
  at::Tensor y, dx, dweight, dinitial_state;
};

Conv1dRun run(Backend backend, at::Tensor const& x0, at::Tensor const& weight0, at::Tensor const& cu, bool silu,
              at::Tensor const& dy, at::Tensor const& state0 = {}) {
  at::Tensor x = x0.detach().clone().requires_grad_(), weight = weight0.detach().clone().requires_grad_();
  at::Tensor state = state0.defined() ? state0.detach().clone().requires_grad_() : at::Tensor();
  at::Tensor y = ops::conv1d(x, weight, cu, silu, backend, state);
  std::vector<at::Tensor> inputs{x, weight};
  if (state.defined()) inputs.push_back(state);
  // allow_unused: with T = 0 the composite's output does not depend on weight at all.
  auto grads = torch::autograd::grad({y}, inputs, {dy}, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true);
  auto or_zeros = [](at::Tensor const& g, at::Tensor const& like) { return g.defined() ? g : at::zeros_like(like); };
  return {y.detach(), or_zeros(grads[0], x), or_zeros(grads[1], weight),
          state.defined() ? or_zeros(grads[2], state) : at::Tensor()};
}

// ---------------------------------------------------------------------------------------------------------------
// Composite on the CPU in fp64 vs the reference.

struct CompositeCase {
  std::string name;
  std::vector<int> lengths;  // zeros allowed; empty = 300 random examples of 1..3 tokens
  int64_t C, W;
  bool silu, with_state;
};

class Conv1dComposite : public ::testing::TestWithParam<CompositeCase> {};

TEST_P(Conv1dComposite, MatchesReferenceOnCpuInFp64) {
  CompositeCase const& tc = GetParam();
  auto rng = test_rng();
  std::vector<int> const lengths = tc.lengths.empty() ? random_lengths(rng, 300, 1, 3) : tc.lengths;
  std::vector<std::int32_t> const cu = cu_seqlens_from_lengths(lengths);
  int64_t const T = cu.back(), N = static_cast<int64_t>(lengths.size());
  Tensor const x = randn({T, tc.C}, rng), weight = randn({tc.C, tc.W}, rng, 0.7), dy = randn({T, tc.C}, rng);
  Tensor const state = tc.with_state ? randn({N, tc.C, tc.W - 1}, rng) : Tensor();
  at::Device const cpu(at::kCPU);
  Conv1dRun const r = run(Backend::kComposite, to_torch(x, at::kDouble, cpu), to_torch(weight, at::kDouble, cpu),
                          cu_tensor(cu, cpu), tc.silu, to_torch(dy, at::kDouble, cpu),
                          tc.with_state ? to_torch(state, at::kDouble, cpu) : at::Tensor());
  Tensor const y = ref::conv1d_fwd(x, weight, cu, tc.silu, state);
  ref::Conv1dGrads const g = ref::conv1d_bwd(dy, x, weight, cu, tc.silu, state);
  // Both sides compute the same fp64 sums (at most W terms per tap sum, T per dweight) in different orders.
  Tolerance const tol{1e-13, 1e-12};
  FUSEPACK_EXPECT_PASS(compare_allclose("y", to_ref(r.y), y, tol, packed_layout(y, cu)));
  FUSEPACK_EXPECT_PASS(compare_allclose("dx", to_ref(r.dx), g.dx, tol, packed_layout(g.dx, cu)));
  FUSEPACK_EXPECT_PASS(compare_allclose("dweight", to_ref(r.dweight), g.dweight, tol));
  if (tc.with_state) {
    FUSEPACK_EXPECT_PASS(compare_allclose("dinitial_state", to_ref(r.dinitial_state), g.dinitial_state, tol));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, Conv1dComposite,
    ::testing::Values(CompositeCase{"w1_c5_silu_seqs_4_1", {4, 1}, 5, 1, true, false},
                      CompositeCase{"w2_c7_seqs_3_1_4_state", {3, 1, 4}, 7, 2, false, true},
                      CompositeCase{"w3_c6_one_example_9", {9}, 6, 3, false, false},
                      CompositeCase{"w3_c9_silu_state_seqs_1_5_2", {1, 5, 2}, 9, 3, true, true},
                      CompositeCase{"w4_c7_silu_seqs_1_2_6", {1, 2, 6}, 7, 4, true, false},
                      CompositeCase{"w4_c5_silu_state_seqs_3_0_4", {3, 0, 4}, 5, 4, true, true},
                      CompositeCase{"w4_c3_silu_300_tiny_examples", {}, 3, 4, true, false},
                      CompositeCase{"w4_c4_silu_state_300_tiny_examples", {}, 4, 4, true, true}),
    [](auto const& tc) { return tc.param.name; });

TEST(Conv1dComposite, ZeroTokens) {
  at::Tensor const x = at::zeros({0, 5}, at::kDouble), weight = at::ones({5, 4}, at::kDouble);
  Conv1dRun const r = run(Backend::kComposite, x, weight, cu_tensor({0, 0, 0}, at::kCPU), true, x);
  EXPECT_EQ(r.y.sizes(), x.sizes());
  EXPECT_EQ(r.dx.sizes(), x.sizes());
  EXPECT_TRUE(at::equal(r.dweight, at::zeros_like(weight)));
}

// ---------------------------------------------------------------------------------------------------------------
// Fused on the GPU vs the reference, the composite in the same dtype as baseline.

struct FusedShape {
  std::string name;
  int64_t C;
  std::vector<int> lengths;  // zeros allowed; empty = 300 random examples of 1..3 tokens
};

class Conv1dFused : public ::testing::TestWithParam<std::tuple<Dtype, int, bool, FusedShape>> {};

TEST_P(Conv1dFused, MatchesReference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto const [dtype, W, silu, shape] = GetParam();
  auto rng = test_rng();
  std::vector<int> const lengths = shape.lengths.empty() ? random_lengths(rng, 300, 1, 3) : shape.lengths;
  std::vector<std::int32_t> const cu = cu_seqlens_from_lengths(lengths);
  int64_t const T = cu.back();
  Tensor x = randn({T, shape.C}, rng), weight = randn({shape.C, W}, rng, 0.7), dy = randn({T, shape.C}, rng);
  for (Tensor* t : {&x, &weight, &dy}) round_to(dtype, *t);  // the reference sees exactly the kernel's inputs
  at::Device const cuda(at::kCUDA);
  at::ScalarType const st = scalar_type(dtype);
  at::Tensor const xt = to_torch(x, st, cuda), wt = to_torch(weight, st, cuda), dyt = to_torch(dy, st, cuda);
  at::Tensor const cut = cu_tensor(cu, cuda);
  Conv1dRun const fused = run(Backend::kFused, xt, wt, cut, silu, dyt);
  Conv1dRun const composite = run(Backend::kComposite, xt, wt, cut, silu, dyt);
  ref::Conv1dGrads const want = ref::conv1d_bwd(dy, x, weight, cu, silu);
  Tensor const y = ref::conv1d_fwd(x, weight, cu, silu);
  FUSEPACK_EXPECT_PASS(check_fused("y", fused.y, composite.y, y, packed_layout(y, cu)));
  FUSEPACK_EXPECT_PASS(check_fused("dx", fused.dx, composite.dx, want.dx, packed_layout(want.dx, cu)));
  FUSEPACK_EXPECT_PASS(check_fused("dweight", fused.dweight, composite.dweight, want.dweight));
}

INSTANTIATE_TEST_SUITE_P(
    Sm90, Conv1dFused,
    ::testing::Combine(
        ::testing::Values(Dtype::kBF16, Dtype::kF16, Dtype::kF32), ::testing::Values(2, 3, 4),
        ::testing::Values(true, false),
        ::testing::Values(FusedShape{"c10240_seqs_1_17_1024", 10240, {1, 17, 1024}},  // Qwen3.5-27B conv_dim
                          // examples starting inside runs and ring chunks, on the pack path
                          FusedShape{"c64_seqs_31_33_64_2_129_5", 64, {31, 33, 64, 2, 129, 5}},
                          FusedShape{"c264_seqs_0_33_0_5_0", 264, {0, 33, 0, 5, 0}},  // empty examples
                          FusedShape{"c520_one_example_777", 520, {777}},
                          FusedShape{"c64_300_tiny_examples", 64, {}},
                          // C not a multiple of 8 (bf16) or 4 (fp32): the scalar path
                          FusedShape{"c7_seqs_5_1_12", 7, {5, 1, 12}},
                          FusedShape{"c4099_seqs_3_40_1", 4099, {3, 40, 1}},
                          FusedShape{"c13_300_tiny_examples", 13, {}},
                          // Edge packs (the FlashAttention-varlen class of bugs around empty and one-token examples).
                          // Every example of length 1 (max_seqlen 1): every token starts an example, so the taps'
                          // history is zeroed at every step; pack and scalar paths.
                          FusedShape{"c64_37_examples_of_1", 64, std::vector<int>(37, 1)},
                          FusedShape{"c13_37_examples_of_1", 13, std::vector<int>(37, 1)},
                          // One token in all: a run shorter than one load chunk (kFwdChunk 4, kBwdChunk 4 or 8).
                          FusedShape{"c64_one_token", 64, {1}},
                          // Length-1 examples between empty ones: the example lookup must skip every empty one.
                          FusedShape{"c64_seqs_0_1_0_0_1_0", 64, {0, 1, 0, 0, 1, 0}},
                          // Run edges (kernels/conv1d: kFwdRun = 32 tokens per forward run, kBwdRun = 64 per backward
                          // run): an example of exactly one forward run, one of exactly one backward run, examples
                          // ending one before, at and one past a 64-token boundary.
                          FusedShape{"c64_one_example_32", 64, {32}},
                          FusedShape{"c64_one_example_64", 64, {64}},
                          FusedShape{"c64_seqs_63_1_64_65", 64, {63, 1, 64, 65}},
                          // Empty examples sitting exactly on run starts (cu_seqlens 0, 0, 32, 32, 32, 96, 96).
                          FusedShape{"c64_seqs_0_32_0_0_64_0", 64, {0, 32, 0, 0, 64, 0}},
                          // An example of exactly one backward block (kBwdRows 8 x kBwdRun 64 = 512 tokens, one
                          // dweight partial), then one filling the next block and one token past it.
                          FusedShape{"c64_seqs_512_513", 64, {512, 513}})),
    [](auto const& tc) {
      return std::string(dtype_name(std::get<0>(tc.param))) + "_w" + std::to_string(std::get<1>(tc.param)) +
             (std::get<2>(tc.param) ? "_silu_" : "_") + std::get<3>(tc.param).name;
    });

TEST(Conv1dFused, ZeroTokens) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const x = at::zeros({0, 16}, opts), weight = at::ones({16, 4}, opts);
  Conv1dRun const r = run(Backend::kFused, x, weight, cu_tensor({0, 0}, at::kCUDA), true, x);
  EXPECT_EQ(r.y.sizes(), x.sizes());
  EXPECT_EQ(r.dx.sizes(), x.sizes());
  EXPECT_TRUE(at::equal(r.dweight, at::zeros_like(weight))) << "dweight of zero tokens must be written as zeros";
}

TEST(Conv1dFused, BackwardIsBitwiseDeterministic) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  std::vector<std::int32_t> const cu = cu_seqlens_from_lengths({1, 17, 1024, 3000});
  int64_t const T = cu.back(), C = 10240;
  at::Device const cuda(at::kCUDA);
  at::Tensor const cut = cu_tensor(cu, cuda);
  for (at::ScalarType st : {at::kBFloat16, at::kFloat}) {
    at::Tensor const x = to_torch(randn({T, C}, rng), st, cuda), weight = to_torch(randn({C, 4}, rng, 0.7), st, cuda);
    at::Tensor const dy = to_torch(randn({T, C}, rng), st, cuda);
    Conv1dRun const a = run(Backend::kFused, x, weight, cut, true, dy);
    Conv1dRun const b = run(Backend::kFused, x, weight, cut, true, dy);
    EXPECT_TRUE(at::equal(a.y, b.y)) << st;
    EXPECT_TRUE(at::equal(a.dx, b.dx)) << st;
    EXPECT_TRUE(at::equal(a.dweight, b.dweight)) << st;
  }
}

TEST(Conv1dFused, RefusesCuSeqlensOnAnotherDevice) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const x = at::ones({5, 16}, opts), weight = at::ones({16, 4}, opts);
  try {
    ops::conv1d(x, weight, cu_tensor({0, 5}, at::kCPU), true, Backend::kFused);
    ADD_FAILURE() << "cu_seqlens on the CPU was accepted by the fused kernel";
  } catch (c10::Error const& e) {
    std::printf("[  error   ] %s\n", e.what_without_backtrace());
    EXPECT_NE(std::string(e.what_without_backtrace()).find("needs cu_seqlens on x's device"), std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// conv1d_parts: the columns of conv1d's y as separate tensors, and the gradients through them.

// conv1d_parts and conv1d on one backend, for loss = Σ_i <dy_i, part_i> (parts listed in `unused` left out of the
// loss: their gradient never arrives) against loss = <cat(dy_i, zeros for the unused), y>.
struct PartsRun {
  std::vector<at::Tensor> parts, whole_parts;  // conv1d_parts' outputs; conv1d's y cut into the same columns
  Conv1dRun parts_grads, whole_grads;
};

PartsRun run_parts(Backend backend, at::Tensor const& x0, at::Tensor const& weight0, at::Tensor const& cu,
                   std::vector<std::int64_t> const& widths, std::vector<at::Tensor> const& dy,
                   std::vector<bool> const& unused) {
  PartsRun r;
  at::Tensor x = x0.detach().clone().requires_grad_(), weight = weight0.detach().clone().requires_grad_();
  std::vector<at::Tensor> const parts = ops::conv1d_parts(x, weight, cu, /*silu=*/true, widths, backend);
  at::Tensor loss = at::zeros({}, x.options().dtype(at::kDouble));
  std::vector<at::Tensor> dy_whole;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    r.parts.push_back(parts[i].detach());
    if (!unused[i]) loss = loss + (parts[i].to(at::kDouble) * dy[i].to(at::kDouble)).sum();
    dy_whole.push_back(unused[i] ? at::zeros_like(dy[i]) : dy[i]);
  }
  auto grads = torch::autograd::grad({loss}, {x, weight});
  r.parts_grads = {at::Tensor(), grads[0], grads[1], at::Tensor()};
  at::Tensor const y_dy = at::cat(dy_whole, 1);
  r.whole_grads = run(backend, x0, weight0, cu, /*silu=*/true, y_dy);
  std::int64_t start = 0;
  for (std::int64_t w : widths) {
    r.whole_parts.push_back(r.whole_grads.y.narrow(1, start, w));
    start += w;
  }
  return r;
}

// Every part equals its columns of conv1d's y to the bit, and dx and dweight equal conv1d's for the concatenated
// gradients (a part the loss leaves out contributes zeros), on the pack path (every part start a multiple of 4) and
// the scalar path, with empty parts and empty examples. A part read at the wrong column or row stride fails here.
TEST(Conv1dFused, PartsAreTheColumnsOfConv1dToTheBit) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  struct Case {
    std::vector<std::int64_t> widths;
    std::vector<bool> unused;
  };
  std::vector<Case> const cases = {
      {{64, 64, 128}, {false, false, false}},  // the Gated DeltaNet's q, k, v (Kd, Kd, Vd)
      {{64, 64, 128}, {false, true, false}},   // k's gradient never arrives
      {{4, 12}, {false, false}},
      {{0, 16, 0, 8}, {false, false, false, false}},  // empty parts
      {{5, 8, 3}, {false, false, false}},             // a part starting off a pack: the scalar path
      {{24}, {false}}};
  auto rng = test_rng();
  std::vector<std::int32_t> const cu = cu_seqlens_from_lengths({0, 33, 1, 0, 100, 7});
  int64_t const T = cu.back();
  at::Device const cuda(at::kCUDA);
  at::Tensor const cut = cu_tensor(cu, cuda);
  for (at::ScalarType st : {at::kBFloat16, at::kFloat}) {
    for (Case const& c : cases) {
      std::int64_t C = 0;
      std::vector<at::Tensor> dy;
      for (std::int64_t w : c.widths) {
        C += w;
        dy.push_back(to_torch(randn({T, w}, rng), st, cuda));
      }
      at::Tensor const x = to_torch(randn({T, C}, rng), st, cuda), weight = to_torch(randn({C, 4}, rng, 0.7), st, cuda);
      PartsRun const r = run_parts(Backend::kFused, x, weight, cut, c.widths, dy, c.unused);
      std::string const where = std::string(c10::toString(st)) + " widths " + c10::str(c10::IntArrayRef(c.widths));
      ASSERT_EQ(r.parts.size(), c.widths.size()) << where;
      for (std::size_t i = 0; i < r.parts.size(); ++i) {
        EXPECT_TRUE(r.parts[i].is_contiguous()) << where << " part " << i;
        EXPECT_TRUE(at::equal(r.parts[i], r.whole_parts[i])) << where << " part " << i;
      }
      EXPECT_TRUE(at::equal(r.parts_grads.dx, r.whole_grads.dx)) << where;
      EXPECT_TRUE(at::equal(r.parts_grads.dweight, r.whole_grads.dweight)) << where;
    }
  }
}

// The composite's parts are conv1d's columns, and its gradients conv1d's, to the bit (fp64, on the CPU).
TEST(Conv1dComposite, PartsAreTheColumnsOfConv1d) {
  auto rng = test_rng();
  std::vector<std::int32_t> const cu = cu_seqlens_from_lengths({3, 0, 9});
  at::Tensor const x = to_torch(randn({12, 10}, rng), at::kDouble, at::kCPU);
  at::Tensor const weight = to_torch(randn({10, 3}, rng, 0.7), at::kDouble, at::kCPU);
  std::vector<at::Tensor> const dy = {to_torch(randn({12, 3}, rng), at::kDouble, at::kCPU),
                                      to_torch(randn({12, 7}, rng), at::kDouble, at::kCPU)};
  PartsRun const r = run_parts(Backend::kComposite, x, weight, cu_tensor(cu, at::kCPU), {3, 7}, dy, {false, false});
  for (std::size_t i = 0; i < 2; ++i) EXPECT_TRUE(at::equal(r.parts[i], r.whole_parts[i])) << "part " << i;
  // Exact: each column's gradient passes through the parts unchanged (the rest of a part's slot are added zeros).
  EXPECT_TRUE(at::equal(r.parts_grads.dx, r.whole_grads.dx));
  EXPECT_TRUE(at::equal(r.parts_grads.dweight, r.whole_grads.dweight));
}

// ---------------------------------------------------------------------------------------------------------------
// Bad input, refused before anything runs, with the reason.

void expect_refused(std::function<void()> const& call, std::string const& substring) {
  try {
    call();
    ADD_FAILURE() << "expected a c10::Error containing '" << substring << "'";
  } catch (c10::Error const& e) {
    std::string const what = e.what_without_backtrace();
    std::printf("[  error   ] %s\n", what.c_str());
    EXPECT_NE(what.find(substring), std::string::npos) << "message: " << what;
  }
}

// Validated cu_seqlens are remembered to spare a device-to-host sync per layer; an in-place write must end that.
TEST(Conv1dOps, RevalidatesCuSeqlensWrittenInPlace) {
  at::Tensor const x = at::ones({5, 4}), w4 = at::ones({4, 4});
  at::Tensor cu = cu_tensor({0, 2, 5}, at::kCPU);
  ops::conv1d(x, w4, cu, true, Backend::kComposite);
  ops::conv1d(x, w4, cu, true, Backend::kComposite);  // the remembered, unchanged tensor
  cu[1].fill_(6);
  expect_refused([&] { ops::conv1d(x, w4, cu, true, Backend::kComposite); },
                 "cu_seqlens must be non-decreasing; got cu_seqlens[1]=6 > cu_seqlens[2]=5");
}

// A batch maker notes the cu_seqlens it copied to the device, so no op reads them back (a sync per step). Noted values
// are checked on the host, and trusted afterwards: values noted unlike the tensor's own come back as noted, which
// shows the device was not read. Several stay noted (a step makes all its micro-batches before the first forward;
// planted: remembering only the last makes the first tensor's check read its own values again, {0, 2, 5}).
TEST(Conv1dOps, NotedCuSeqlensAreCheckedOnTheHostThenTrusted) {
  at::Tensor const first = cu_tensor({0, 2, 5}, at::kCPU), second = cu_tensor({0, 1, 5}, at::kCPU);
  ops::note_cu_seqlens("test", first, {0, 3, 5});
  ops::note_cu_seqlens("test", second, {0, 4, 5});
  EXPECT_EQ(ops::check_cu_seqlens("test", first, 5), (std::vector<std::int32_t>{0, 3, 5}));
  EXPECT_EQ(ops::check_cu_seqlens("test", second, 5), (std::vector<std::int32_t>{0, 4, 5}));
  first[1].fill_(2);  // an in-place write: read again
  EXPECT_EQ(ops::check_cu_seqlens("test", first, 5), (std::vector<std::int32_t>{0, 2, 5}));
  expect_refused([&] { ops::note_cu_seqlens("maker", cu_tensor({0, 3, 2}, at::kCPU), {0, 3, 2}); },
                 "maker: cu_seqlens must be non-decreasing; got cu_seqlens[1]=3 > cu_seqlens[2]=2");
  expect_refused([&] { ops::note_cu_seqlens("maker", cu_tensor({0, 3, 5}, at::kCPU), {0, 5}); },
                 "maker: 2 cu_seqlens values noted for a tensor of 3");
  expect_refused([&] { ops::check_cu_seqlens("op", second, 6); },  // noted with T = 5
                 "op: cu_seqlens must end at the number of tokens T=6; got cu_seqlens[2]=5");
}

// Host-to-device copies that do not wait for the GPU: the values and dtype arrive as `to` would give them.
void expect_host_to_device_copies(at::Device device) {
  std::vector<std::int32_t> values(100000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::int32_t>(i * 7919 % 100003) - 50000;
  at::Tensor const host = at::tensor(values, at::TensorOptions().dtype(at::kInt));
  for (at::ScalarType dtype : {at::kInt, at::kLong}) {
    at::Tensor const got = ops::host_to_device(values, dtype, device);
    EXPECT_EQ(got.device(), device);
    EXPECT_EQ(got.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(got.cpu(), host.to(dtype))) << c10::toString(dtype);
  }
}

TEST(Conv1dOps, HostToDeviceCopiesTheValues) { expect_host_to_device_copies(at::kCPU); }

TEST(Conv1dFused, HostToDeviceCopiesTheValuesWithoutWaiting) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_host_to_device_copies(at::Device(at::kCUDA, 0));
}

TEST(Conv1dOps, RejectsBadInput) {
  at::Tensor const x = at::ones({5, 4}), w4 = at::ones({4, 4});
  at::Tensor const cu = cu_tensor({0, 2, 5}, at::kCPU);
  auto composite = Backend::kComposite, fused = Backend::kFused;
  expect_refused([&] { ops::conv1d(x, at::ones({4, 5}), cu, true, composite); },
                 "weight width W (dimension 1 of weight [4, 5]) must be in 1..4; got W=5");
  expect_refused([&] { ops::conv1d(x, at::ones({4, 5}), cu, true, fused); }, "must be in 1..4; got W=5");
  expect_refused([&] { ops::conv1d(x, at::ones({4, 1}), cu, true, fused); },
                 "the fused kernel supports width W in 2..4; got W=1");
  expect_refused([&] { ops::conv1d(at::ones({5, 4, 1}), w4, cu, true, composite); }, "x must have 2 dimensions");
  expect_refused([&] { ops::conv1d(x, at::ones({3, 4}), cu, true, composite); },
                 "weight has shape [3, 4]; expected 4 in dimension 0");
  expect_refused([&] { ops::conv1d(x, w4, cu.to(at::kLong), true, composite); }, "cu_seqlens must be int32");
  expect_refused([&] { ops::conv1d(x, w4, cu_tensor({0, 3, 2, 5}, at::kCPU), true, composite); },
                 "cu_seqlens must be non-decreasing; got cu_seqlens[1]=3 > cu_seqlens[2]=2");
  expect_refused([&] { ops::conv1d(x, w4, cu_tensor({0, 2, 4}, at::kCPU), true, composite); },
                 "cu_seqlens must end at the number of tokens T=5; got cu_seqlens[2]=4");
  expect_refused([&] { ops::conv1d(x, w4.to(at::kDouble), cu, true, composite); },
                 "weight has dtype Double but x has Float");
  expect_refused([&] { ops::conv1d(x, w4, cu, true, composite, at::ones({2, 4, 2})); },
                 "initial_state has shape [2, 4, 2]; expected 3 in dimension 2");
  expect_refused([&] { ops::conv1d(x, w4, cu, true, fused, at::ones({2, 4, 3})); },
                 "the fused kernel does not take initial_state");
  // The fused backend never falls back: CPU tensors are refused with the reason.
  expect_refused([&] { ops::conv1d(x, w4, cu, true, fused); }, "CUDA");
  expect_refused([&] { ops::conv1d_parts(x, w4, cu, true, {1, 2}, composite); },
                 "conv1d_parts: widths must be 1..4 column counts summing to x's 4 channels; got [1, 2]");
  expect_refused([&] { ops::conv1d_parts(x, w4, cu, true, {1, 1, 1, 1, 0}, composite); }, "got [1, 1, 1, 1, 0]");
  expect_refused([&] { ops::conv1d_parts(x, w4, cu, true, {}, composite); }, "got []");
  expect_refused([&] { ops::conv1d_parts(x, w4, cu, true, {6, -2}, composite); },
                 "conv1d_parts: every width must be >= 0; got -2 in [6, -2]");
}

}  // namespace
}  // namespace fusepack::test
