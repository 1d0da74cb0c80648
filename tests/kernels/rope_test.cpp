// rope on both backends: the fused kernel against the fp64 reference under docs/contracts.md, numerics, with the
// composite in the same dtype as baseline (suites *Fused*: labels kernels + gpu); the composite on the CPU against the
// reference in fp64; determinism; bad input. Positions restart at 0 for every packed example, as the trainer builds
// them.
#include "kernels/ops/rope.h"
#include "reference/rope.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/torch_bridge.h"
#include "verify/random.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace fusepack::test {
namespace {

using ops::Backend;
using ref::Tensor;

struct RopeCase {
  std::string name;
  int64_t H, D, rotary_dim;
  std::vector<int> lengths;      // packed examples; positions restart at 0 for each
  double theta = 1e7;            // Qwen3.5
  bool large_positions = false;  // positions drawn up to 100000 instead of restarting per example
};
void PrintTo(RopeCase const& c, std::ostream* os) { *os << c.name; }

// Positions 0..len−1 of every example, concatenated.
std::vector<int64_t> positions_from_lengths(std::vector<int> const& lengths) {
  std::vector<int64_t> pos;
  for (int len : lengths) {
    for (int i = 0; i < len; ++i) pos.push_back(i);
  }
  return pos;
}

// Positions far past any trained context, with the edges written out: an fp32 angle is off by ~6e-3 rad at 100000.
std::vector<int64_t> large_positions(std::mt19937_64& rng, int64_t T) {
  std::vector<int64_t> pos(T);
  int64_t const fixed[] = {0, 1, 8191, 8192, 32768, 65535, 99999, 100000};
  for (int64_t t = 0; t < T; ++t) pos[t] = t < 8 ? fixed[t] : uniform_int(rng, 0, 100000);
  return pos;
}

at::Tensor positions_tensor(std::vector<int64_t> const& pos, at::Device device) {
  return at::tensor(pos, at::TensorOptions().dtype(at::kLong)).to(device);
}

// Forward and gradient of one backend, for loss = <dy, y>.
struct RopeRun {
  at::Tensor y, dx;
};

RopeRun run(Backend backend, at::Tensor const& x0, at::Tensor const& pos, int64_t rotary_dim, double theta,
            at::Tensor const& dy) {
  at::Tensor x = x0.detach().clone().requires_grad_();
  at::Tensor y = ops::rope(x, pos, rotary_dim, theta, backend);
  auto grads = torch::autograd::grad({y}, {x}, {dy});
  return {y.detach(), grads[0]};
}

std::vector<int32_t> cu_of(std::vector<int64_t> const& pos) {  // for the failure messages' (example, position)
  std::vector<int32_t> cu{0};
  for (size_t t = 1; t <= pos.size(); ++t) {
    if (t == pos.size() || pos[t] == 0) cu.push_back(static_cast<int32_t>(t));
  }
  return cu;
}

TEST(RopeComposite, MatchesReferenceOnCpuInFp64) {
  auto rng = test_rng();
  at::Device const cpu(at::kCPU);
  std::vector<RopeCase> const cases = {{"h3_d16_r8_theta1e4", 3, 16, 8, {1, 5, 9}, 1e4},
                                       {"odd_h2_d10_r4", 2, 10, 4, {3, 4}},
                                       {"full_rotary_h2_d8_r8", 2, 8, 8, {6}},
                                       {"large_positions_h2_d16_r16", 2, 16, 16, {}, 1e7, true}};
  for (RopeCase const& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<int64_t> const pos = c.large_positions ? large_positions(rng, 40) : positions_from_lengths(c.lengths);
    int64_t const T = static_cast<int64_t>(pos.size());
    Tensor const x = randn({T, c.H, c.D}, rng), dy = randn({T, c.H, c.D}, rng);
    RopeRun const r = run(Backend::kComposite, to_torch(x, at::kDouble, cpu), positions_tensor(pos, cpu), c.rotary_dim,
                          c.theta, to_torch(dy, at::kDouble, cpu));
    // Both sides compute in fp64 with inv_freq written differently (1/θ^e vs θ^−e): the angles agree to a few ulp of
    // pos·inv_freq, so |Δy| <= |x| · 1e5 · 4e-16 · (a few) < 1e-9 at positions up to 1e5.
    Tolerance const tol{1e-9, 0};
    FUSEPACK_EXPECT_PASS(
        compare_allclose("y " + c.name, to_ref(r.y), ref::rope_fwd(x, pos, c.rotary_dim, c.theta), tol));
    FUSEPACK_EXPECT_PASS(
        compare_allclose("dx " + c.name, to_ref(r.dx), ref::rope_bwd(dy, pos, c.rotary_dim, c.theta), tol));
  }
}

// A second witness over random shapes: heads, head size, rotated channels (even, up to the head size), theta and the
// pack's lengths drawn per round from the test's seed; the tolerance is the fixed cases' (same arithmetic).
TEST(RopeComposite, MatchesReferenceOnRandomShapesAndPacks) {
  auto rng = test_rng();
  at::Device const cpu(at::kCPU);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int round = 0; round < 24; ++round) {
    int64_t const H = uniform(1, 5), D = 2 * uniform(1, 12), rotary_dim = 2 * uniform(1, static_cast<int>(D / 2));
    double const theta = std::pow(10.0, uniform(2, 7));
    std::vector<int> lengths(static_cast<std::size_t>(uniform(1, 4)));
    for (int& l : lengths) l = uniform(1, 9);
    std::vector<int64_t> const pos = positions_from_lengths(lengths);
    int64_t const T = static_cast<int64_t>(pos.size());
    SCOPED_TRACE("round " + std::to_string(round) + ": H " + std::to_string(H) + ", D " + std::to_string(D) +
                 ", rotary " + std::to_string(rotary_dim) + ", T " + std::to_string(T));
    Tensor const x = randn({T, H, D}, rng), dy = randn({T, H, D}, rng);
    RopeRun const r = run(Backend::kComposite, to_torch(x, at::kDouble, cpu), positions_tensor(pos, cpu), rotary_dim,
                          theta, to_torch(dy, at::kDouble, cpu));
    Tolerance const tol{1e-9, 0};
    FUSEPACK_EXPECT_PASS(compare_allclose("y", to_ref(r.y), ref::rope_fwd(x, pos, rotary_dim, theta), tol));
    FUSEPACK_EXPECT_PASS(compare_allclose("dx", to_ref(r.dx), ref::rope_bwd(dy, pos, rotary_dim, theta), tol));
  }
}

TEST(RopeComposite, HandlesNoTokens) {
  at::Tensor const x = at::randn({0, 4, 16}, at::kDouble), pos = at::zeros({0}, at::kLong);
  RopeRun const r = run(Backend::kComposite, x, pos, 8, 1e7, at::randn({0, 4, 16}, at::kDouble));
  EXPECT_EQ(r.y.sizes(), x.sizes());
  EXPECT_EQ(r.dx.sizes(), x.sizes());
}

class RopeFused : public ::testing::TestWithParam<std::tuple<Dtype, RopeCase>> {};

TEST_P(RopeFused, MatchesReference) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto const& [dtype, c] = GetParam();
  auto rng = test_rng();
  std::vector<int64_t> const pos = c.large_positions ? large_positions(rng, 97) : positions_from_lengths(c.lengths);
  int64_t const T = static_cast<int64_t>(pos.size());
  Tensor x = randn({T, c.H, c.D}, rng), dy = randn({T, c.H, c.D}, rng);
  for (Tensor* t : {&x, &dy}) round_to(dtype, *t);  // the reference sees exactly the kernel's inputs
  at::Device const cuda(at::kCUDA);
  at::ScalarType const st = scalar_type(dtype);
  at::Tensor const xt = to_torch(x, st, cuda), dyt = to_torch(dy, st, cuda), post = positions_tensor(pos, cuda);
  RopeRun const fused = run(Backend::kFused, xt, post, c.rotary_dim, c.theta, dyt),
                composite = run(Backend::kComposite, xt, post, c.rotary_dim, c.theta, dyt);
  Tensor const want_y = ref::rope_fwd(x, pos, c.rotary_dim, c.theta),
               want_dx = ref::rope_bwd(dy, pos, c.rotary_dim, c.theta);
  IndexLayout const layout = c.large_positions ? plain_layout(want_y) : packed_layout(want_y, cu_of(pos));
  FUSEPACK_EXPECT_PASS(check_fused("y", fused.y, composite.y, want_y, layout));
  FUSEPACK_EXPECT_PASS(check_fused("dx", fused.dx, composite.dx, want_dx, layout));
}

std::vector<int> tiny_lengths(int count) {  // 1, 2, 3, 4, 1, 2, ...: hundreds of tiny examples
  std::vector<int> lengths(count);
  for (int i = 0; i < count; ++i) lengths[i] = 1 + i % 4;
  return lengths;
}

std::vector<RopeCase> const kRopeCases = {
    {"qwen35_27b_q_h24_d256_r64_seqs_1_17_300", 24, 256, 64, {1, 17, 300}},
    {"qwen35_27b_k_h4_d256_r64_seqs_1_17_300", 4, 256, 64, {1, 17, 300}},
    {"full_rotary_h2_d128_r128_seqs_5_64", 2, 128, 128, {5, 64}},
    {"odd_h3_d10_r4_seqs_1_2_7", 3, 10, 4, {1, 2, 7}},
    {"unvectorised_half_h5_d24_r12_seqs_3_40", 5, 24, 12, {3, 40}},
    {"large_positions_h2_d256_r64_to_100000", 2, 256, 64, {}, 1e7, true},
    {"tiny_h4_d256_r64_300_examples_1_to_4", 4, 256, 64, tiny_lengths(300)},
    {"one_token_h1_d2_r2", 1, 2, 2, {1}, 1e4},
    // Edge packs (the FlashAttention-varlen class of bugs around empty and one-token examples), appended so that the
    // indices Sm90Half picks stay put. Every example of length 1 (max_seqlen 1): every position is 0, an exact
    // identity rotation.
    {"all_length_1_h4_d256_r64_37_examples", 4, 256, 64, std::vector<int>(37, 1)},
    // One token in all on the vector path (the block's token count is capped at T = 1).
    {"one_token_qwen35_27b_q_h24_d256_r64", 24, 256, 64, {1}},
    // Empty examples at the start, middle and end: rope sees only position_ids, so they leave no trace (the pack is
    // {5, 3}); kept so that every op runs the same edge packs.
    {"empty_examples_h4_d256_r64_seqs_0_5_0_3_0", 4, 256, 64, {0, 5, 0, 3, 0}},
    // Block edges: a block owns tokens_per_block consecutive tokens, capped at 64 (launch_rope_rotate in
    // kernels/rope/rope_rotate.cuh), which this shape reaches in bf16 and fp32: exactly one block (T = 64), then
    // positions restarting one token before and exactly at block starts, the last example one token into a fourth
    // block (T = 193).
    {"full_rotary_h2_d128_r128_one_example_64", 2, 128, 128, {64}},
    {"full_rotary_h2_d128_r128_seqs_63_1_64_65", 2, 128, 128, {63, 1, 64, 65}},
};

std::string rope_case_name(::testing::TestParamInfo<std::tuple<Dtype, RopeCase>> const& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(Sm90, RopeFused,
                         ::testing::Combine(::testing::Values(Dtype::kBF16, Dtype::kF32),
                                            ::testing::ValuesIn(kRopeCases)),
                         rope_case_name);
INSTANTIATE_TEST_SUITE_P(Sm90Half, RopeFused,
                         ::testing::Combine(::testing::Values(Dtype::kF16),
                                            ::testing::Values(kRopeCases[0], kRopeCases[3])),
                         rope_case_name);

TEST(RopeFused, HandlesNoTokens) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor const x = at::randn({0, 24, 256}, opts), pos = at::zeros({0}, opts.dtype(at::kLong));
  RopeRun const r = run(Backend::kFused, x, pos, 64, 1e7, at::randn({0, 24, 256}, opts));
  EXPECT_EQ(r.y.sizes(), x.sizes());
  EXPECT_EQ(r.dx.sizes(), x.sizes());
}

TEST(RopeFused, BackwardIsBitwiseDeterministic) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  auto rng = test_rng();
  at::Device const cuda(at::kCUDA);
  std::vector<int64_t> const pos = positions_from_lengths({1, 17, 300, 1024});
  int64_t const T = static_cast<int64_t>(pos.size());
  at::Tensor const x = to_torch(randn({T, 24, 256}, rng), at::kBFloat16, cuda),
                   dy = to_torch(randn({T, 24, 256}, rng), at::kBFloat16, cuda), post = positions_tensor(pos, cuda);
  RopeRun const a = run(Backend::kFused, x, post, 64, 1e7, dy), b = run(Backend::kFused, x, post, 64, 1e7, dy);
  EXPECT_TRUE(at::equal(a.y, b.y));
  EXPECT_TRUE(at::equal(a.dx, b.dx));
}

TEST(RopeOps, RejectsBadInput) {
  at::Tensor const x = at::randn({5, 2, 16}), pos = at::arange(5, at::kLong);
  auto rope = [&](at::Tensor const& xx, at::Tensor const& pp, int64_t r, double theta, Backend b) {
    return [=] { ops::rope(xx, pp, r, theta, b); };
  };
  expect_torch_error(rope(x, pos, 7, 1e7, Backend::kComposite), "rotary_dim must be even");
  expect_torch_error(rope(x, pos, 18, 1e7, Backend::kComposite), "rotary_dim must be in 2..D = 2..16");
  expect_torch_error(rope(x, pos, 0, 1e7, Backend::kComposite), "rotary_dim must be in 2..D");
  expect_torch_error(rope(x, at::arange(4, at::kLong), 8, 1e7, Backend::kComposite),
                     "position_ids must have shape [T] = [5]");
  expect_torch_error(rope(x, at::arange(5, at::kInt), 8, 1e7, Backend::kComposite), "position_ids must be int64");
  expect_torch_error(rope(x, pos, 8, 0.0, Backend::kComposite), "theta must be positive");
  expect_torch_error(rope(at::randn({5, 16}), pos, 8, 1e7, Backend::kComposite), "x must have 3 dimensions");
  expect_torch_error(rope(x.to(at::kInt), pos, 8, 1e7, Backend::kComposite), "x must be floating point");
  // The fused backend never falls back: CPU tensors are refused with the reason.
  expect_torch_error(rope(x, pos, 8, 1e7, Backend::kFused), "fused");
}

}  // namespace
}  // namespace fusepack::test
