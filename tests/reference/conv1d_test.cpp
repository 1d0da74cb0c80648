// conv1d reference: backward (dx, dweight, dinitial_state) vs finite differences, hand-computed cases (W = 1, a W = 3
// two-example pack, initial states feeding examples shorter than W − 1), packed == examples stitched, T = 0, bad
// arguments.
#include "reference/conv1d.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "verify/gradcheck.h"
#include "verify/random.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using ref::Index;
using ref::Shape;
using ref::Tensor;

struct Conv1dCase {
  std::string name;
  std::vector<int> lengths;  // of the packed examples; zeros allowed
  Index C, W;
  bool silu, with_state;
};

class Conv1dRef : public ::testing::TestWithParam<Conv1dCase> {};

std::string describe(Conv1dCase const& tc) {
  std::string s = " c" + std::to_string(tc.C) + " w" + std::to_string(tc.W) + (tc.silu ? " silu" : "") +
                  (tc.with_state ? " state" : "") + " lengths";
  for (int len : tc.lengths) s += " " + std::to_string(len);
  return s;
}

void expect_backward_matches_finite_differences(Conv1dCase const& tc, std::mt19937_64& rng) {
  std::vector<std::int32_t> const cu = cu_seqlens_from_lengths(tc.lengths);
  Index const T = cu.back(), N = static_cast<Index>(tc.lengths.size());
  Tensor x = randn({T, tc.C}, rng);
  Tensor weight = randn({tc.C, tc.W}, rng, 0.7);
  Tensor state = tc.with_state ? randn({N, tc.C, tc.W - 1}, rng) : Tensor();
  Tensor const dy = randn({T, tc.C}, rng);
  auto loss = [&] { return dot(dy, ref::conv1d_fwd(x, weight, cu, tc.silu, state)); };
  ref::Conv1dGrads const g = ref::conv1d_bwd(dy, x, weight, cu, tc.silu, state);
  std::string const where = describe(tc);
  FUSEPACK_EXPECT_PASS(check_gradient("dx" + where, loss, x, g.dx, packed_layout(x, cu)));
  FUSEPACK_EXPECT_PASS(check_gradient("dweight" + where, loss, weight, g.dweight, plain_layout(weight)));
  if (tc.with_state) {
    FUSEPACK_EXPECT_PASS(check_gradient("dinitial_state" + where, loss, state, g.dinitial_state, plain_layout(state)));
  } else {
    EXPECT_FALSE(g.dinitial_state.defined()) << "dinitial_state without an initial_state";
  }
}

TEST_P(Conv1dRef, BackwardMatchesFiniteDifferences) {
  auto rng = test_rng();
  expect_backward_matches_finite_differences(GetParam(), rng);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Conv1dRef,
    ::testing::Values(Conv1dCase{"w1_c5_one_example_silu", {4}, 5, 1, true, false},
                      Conv1dCase{"w1_c3_empty_state", {2, 3}, 3, 1, false, true},
                      Conv1dCase{"w2_c7_three_examples_state", {3, 1, 4}, 7, 2, false, true},
                      Conv1dCase{"w3_c7_silu", {5, 2}, 7, 3, true, false},
                      Conv1dCase{"w3_c6_one_example", {9}, 6, 3, false, false},
                      Conv1dCase{"w4_c7_examples_shorter_than_state_silu", {1, 2, 6}, 7, 4, true, true},
                      Conv1dCase{"w4_c3_many_tiny_examples", {1, 1, 2, 1, 1, 1, 3, 1}, 3, 4, true, true},
                      Conv1dCase{"w4_c5_zero_length_example", {3, 0, 4}, 5, 4, true, true},
                      Conv1dCase{"w4_c1_one_token", {1}, 1, 4, false, true},
                      Conv1dCase{"w4_c4_zero_tokens", {0}, 4, 4, true, true}),
    [](auto const& tc) { return tc.param.name; });

TEST(Conv1dRef, BackwardMatchesFiniteDifferencesOnRandomShapes) {
  auto rng = test_rng();
  for (int c = 0; c < cases(3, 40); ++c) {
    Conv1dCase const tc{"random",
                        random_lengths(rng, uniform_int(rng, 1, 4), 0, 6),
                        uniform_int(rng, 1, 9),
                        uniform_int(rng, 1, 4),
                        uniform_int(rng, 0, 1) == 1,
                        uniform_int(rng, 0, 1) == 1};
    expect_backward_matches_finite_differences(tc, rng);
  }
}

TEST(Conv1dRef, MatchesClosedFormWidthOne) {
  // W = 1: only the current token, y[t, c] = silu(weight[c, 0]·x[t, c]) (or without silu, the product itself);
  // the products below are exact in binary, so the linear case compares exactly.
  Tensor const x({3, 2}, {1.0, -2.0, 0.5, 4.0, -3.0, 0.25});
  Tensor const weight({2, 1}, {2.0, -0.5});
  std::vector<std::int32_t> const cu{0, 1, 3};
  Tensor const lin = ref::conv1d_fwd(x, weight, cu, false);
  Tensor const act = ref::conv1d_fwd(x, weight, cu, true);
  for (Index t = 0; t < 3; ++t) {
    for (Index c = 0; c < 2; ++c) {
      double const wx = weight({c, 0}) * x({t, c});
      EXPECT_EQ(lin({t, c}), wx);
      EXPECT_NEAR(act({t, c}), wx / (1.0 + std::exp(-wx)), 1e-15);
    }
  }
}

TEST(Conv1dRef, MatchesHandComputedWidthThreeTwoExamplePack) {
  // W = 3, examples of lengths 2 and 2, no state (zeros before each example), no silu. Channel 0 has weight
  // (1, 2, 3) (3 on the current token) and x = 1, 10 | 100, 1000:
  //   y = 3·1 = 3,  2·1 + 3·10 = 32  |  3·100 = 300 (not 1·1 + 2·10 + 3·100 = 321: no tap reaches example 0),
  //       2·100 + 3·1000 = 3200.
  // Channel 1 (depthwise: its own weights (0.5, −1, 2)), x = 2, −3 | 4, 5: y = 4, −2 − 6 = −8 | 8, −4 + 10 = 6.
  // Backward with dy = 1 everywhere: dx[q] = Σ over the taps that read q of their weight, within the example:
  //   first token of each example is read by both tokens (w2 + w1), the second only by itself (w2):
  //   channel 0 dx = 5, 3 | 5, 3, channel 1 dx = 1, 2 | 1, 2.
  //   dweight[c, j] = Σ of the inputs tap j read: j = 2 reads every token, j = 1 each example's first token,
  //   j = 0 only padding: channel 0 (0, 1 + 100, 1111), channel 1 (0, 2 + 4, 8).
  Tensor const x({4, 2}, {1, 2, 10, -3, 100, 4, 1000, 5});
  Tensor const weight({2, 3}, {1, 2, 3, 0.5, -1, 2});
  std::vector<std::int32_t> const cu{0, 2, 4};
  Tensor const y = ref::conv1d_fwd(x, weight, cu, false);
  EXPECT_EQ(y.flat(), (Tensor({4, 2}, {3, 4, 32, -8, 300, 8, 3200, 6}).flat()));
  Tensor dy({4, 2});
  dy.flat().setOnes();
  ref::Conv1dGrads const g = ref::conv1d_bwd(dy, x, weight, cu, false);
  EXPECT_EQ(g.dx.flat(), (Tensor({4, 2}, {5, 1, 3, 2, 5, 1, 3, 2}).flat()));
  EXPECT_EQ(g.dweight.flat(), (Tensor({2, 3}, {0, 101, 1111, 0, 6, 8}).flat()));
}

TEST(Conv1dRef, InitialStateFeedsLaterTokensOfExamplesShorterThanIt) {
  // W = 4, one channel, weight (1, 2, 3, 4), examples of lengths 1 and 2 with states (10, 20, 30) and (40, 50, 60)
  // (oldest first), x = 1 | 2, 3:
  //   example 0: 1·10 + 2·20 + 3·30 + 4·1 = 144
  //   example 1: 1·40 + 2·50 + 3·60 + 4·2 = 328, then the second token still reads two state slots:
  //              1·50 + 2·60 + 3·2 + 4·3 = 188.
  // With dy = 1: dinitial_state[n, 0, s] = Σ of the weights of the taps that read slot s:
  //   example 0 (one token): (w0, w1, w2) = (1, 2, 3); example 1: (w0, w1 + w0, w2 + w1) = (1, 3, 5).
  Tensor const x({3, 1}, {1, 2, 3});
  Tensor const weight({1, 4}, {1, 2, 3, 4});
  Tensor const state({2, 1, 3}, {10, 20, 30, 40, 50, 60});
  std::vector<std::int32_t> const cu{0, 1, 3};
  EXPECT_EQ(ref::conv1d_fwd(x, weight, cu, false, state).flat(), (Tensor({3, 1}, {144, 328, 188}).flat()));
  Tensor dy({3, 1});
  dy.flat().setOnes();
  ref::Conv1dGrads const g = ref::conv1d_bwd(dy, x, weight, cu, false, state);
  EXPECT_EQ(g.dinitial_state.flat(), (Tensor({2, 1, 3}, {1, 2, 3, 1, 3, 5}).flat()));
  // Without a state the same pack reads zeros: 4·1 | 4·2, 3·2 + 4·3.
  EXPECT_EQ(ref::conv1d_fwd(x, weight, cu, false).flat(), (Tensor({3, 1}, {4, 8, 18}).flat()));
}

// Rows [start, start + len) of t along dimension 0.
Tensor slice0(Tensor const& t, Index start, Index len) {
  Shape shape = t.shape();
  Index const row = shape[0] ? t.numel() / shape[0] : 0;
  shape[0] = len;
  Tensor out(shape);
  out.flat() = t.flat().segment(start * row, len * row);
  return out;
}

void place0(Tensor& t, Tensor const& part, Index start) {
  t.flat().segment(start * (part.numel() / std::max<Index>(part.size(0), 1)), part.numel()) = part.flat();
}

void expect_packed_equals_examples_stitched(bool with_state, std::mt19937_64& rng) {
  // Each example computed alone (cu_seqlens {0, L}, its own state row) and concatenated must give the packed result
  // bit for bit: the same products summed in the same order. dweight sums over examples, and the pack adds token
  // after token while the stitched side adds per-example sums, so it agrees only to rounding (1e-13 relative).
  std::vector<int> const lengths{3, 1, 0, 5, 2, 1};
  Index const C = 7, W = 4, N = static_cast<Index>(lengths.size());
  std::vector<std::int32_t> const cu = cu_seqlens_from_lengths(lengths);
  Index const T = cu.back();
  Tensor const x = randn({T, C}, rng);
  Tensor const weight = randn({C, W}, rng, 0.7);
  Tensor const state = with_state ? randn({N, C, W - 1}, rng) : Tensor();
  Tensor const dy = randn({T, C}, rng);
  Tensor const y = ref::conv1d_fwd(x, weight, cu, true, state);
  ref::Conv1dGrads const g = ref::conv1d_bwd(dy, x, weight, cu, true, state);

  Tensor y_st({T, C}), dx_st({T, C}), dweight_st({C, W});
  Tensor dstate_st = with_state ? Tensor({N, C, W - 1}) : Tensor();
  for (Index n = 0; n < N; ++n) {
    Index const start = cu[n], len = lengths[n];
    std::vector<std::int32_t> const alone{0, static_cast<std::int32_t>(len)};
    Tensor const state_n = with_state ? slice0(state, n, 1) : Tensor();
    place0(y_st, ref::conv1d_fwd(slice0(x, start, len), weight, alone, true, state_n), start);
    ref::Conv1dGrads const gn = ref::conv1d_bwd(slice0(dy, start, len), slice0(x, start, len), weight, alone, true,
                                                state_n);
    place0(dx_st, gn.dx, start);
    dweight_st.flat() += gn.dweight.flat();
    if (with_state) place0(dstate_st, gn.dinitial_state, n);
  }
  std::string const tag = with_state ? " (with initial_state)" : " (zero history)";
  FUSEPACK_EXPECT_PASS(compare_allclose("y packed vs stitched" + tag, y, y_st, {0, 0}, packed_layout(y, cu)));
  FUSEPACK_EXPECT_PASS(compare_allclose("dx packed vs stitched" + tag, g.dx, dx_st, {0, 0}, packed_layout(y, cu)));
  FUSEPACK_EXPECT_PASS(
      compare_allclose("dweight packed vs stitched" + tag, g.dweight, dweight_st, {0, 1e-13}, plain_layout(weight)));
  if (with_state) {
    FUSEPACK_EXPECT_PASS(compare_allclose("dinitial_state packed vs stitched" + tag, g.dinitial_state, dstate_st,
                                          {0, 0}, plain_layout(state)));
  }
}

TEST(Conv1dRef, PackedEqualsExamplesStitched) {
  auto rng = test_rng();
  expect_packed_equals_examples_stitched(false, rng);
  expect_packed_equals_examples_stitched(true, rng);
}

TEST(Conv1dRef, ChangingOneExampleLeavesTheOthersBitwiseUnchanged) {
  // No leak across the boundary in either direction: perturbing example 1 changes its own outputs and gradients
  // only; example 0 and 2 outputs and dx are bitwise the same, and so are the other examples' state gradients.
  auto rng = test_rng();
  std::vector<std::int32_t> const cu{0, 2, 5, 9};
  Index const C = 5, W = 4;
  Tensor const x = randn({9, C}, rng);
  Tensor const weight = randn({C, W}, rng);
  Tensor const state = randn({3, C, W - 1}, rng);
  Tensor const dy = randn({9, C}, rng);
  Tensor x2 = x, dy2 = dy, state2 = state;
  for (Index t = 2; t < 5; ++t) {
    x2.vec({t}) *= -3.0;
    dy2.vec({t}).array() += 1.0;
  }
  state2.mat({1}) *= 2.0;
  Tensor const y = ref::conv1d_fwd(x, weight, cu, true, state), y2 = ref::conv1d_fwd(x2, weight, cu, true, state2);
  ref::Conv1dGrads const g = ref::conv1d_bwd(dy, x, weight, cu, true, state);
  ref::Conv1dGrads const g2 = ref::conv1d_bwd(dy2, x2, weight, cu, true, state2);
  for (Index t : {0, 1, 5, 6, 7, 8}) {
    EXPECT_EQ(y.vec({t}), y2.vec({t})) << "y token " << t;
    EXPECT_EQ(g.dx.vec({t}), g2.dx.vec({t})) << "dx token " << t;
  }
  for (Index n : {0, 2}) EXPECT_EQ(g.dinitial_state.mat({n}), g2.dinitial_state.mat({n})) << "example " << n;
  EXPECT_NE(y.vec({2}), y2.vec({2})) << "the perturbation must reach example 1 itself";
}

TEST(Conv1dRef, HandlesZeroTokens) {
  // T = 0 with one and with two empty examples: empty outputs, zero dweight and zero state gradients.
  Tensor const x({0, 3});
  Tensor const weight({3, 4}, std::vector<double>(12, 1.0));
  for (std::vector<std::int32_t> const& cu : {std::vector<std::int32_t>{0, 0}, std::vector<std::int32_t>{0, 0, 0}}) {
    Index const N = static_cast<Index>(cu.size()) - 1;
    Tensor state({N, 3, 3}, std::vector<double>(N * 9, 1.0));
    EXPECT_EQ(ref::conv1d_fwd(x, weight, cu, true, state).shape(), (Shape{0, 3}));
    ref::Conv1dGrads const g = ref::conv1d_bwd(Tensor({0, 3}), x, weight, cu, true, state);
    EXPECT_EQ(g.dx.shape(), (Shape{0, 3}));
    EXPECT_TRUE(g.dweight.flat().isZero(0));
    EXPECT_EQ(g.dinitial_state.shape(), (Shape{N, 3, 3}));
    EXPECT_TRUE(g.dinitial_state.flat().isZero(0));
  }
}

TEST(Conv1dRef, RejectsBadArguments) {
  Tensor const x({5, 4});
  Tensor const weight({4, 3});
  std::vector<std::int32_t> const cu{0, 2, 5};
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, Tensor({4, 0}), cu, true), "must be in 1..4; got 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, Tensor({4, 5}), cu, true), "must be in 1..4; got 5");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, Tensor({3, 3}), cu, true),
                                   "weight has shape [3, 3]; expected 4 in dimension 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, Tensor({4}), cu, true), "weight must have 2 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(Tensor({5, 4, 1}), weight, cu, true), "x must have 2 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(Tensor(), weight, cu, true), "x is required");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, weight, {1, 5}, true), "cu_seqlens must start at 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, weight, {0, 3, 2, 5}, true), "must be non-decreasing");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, weight, {0, 2, 4}, true), "must end at the number of tokens T=5");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, weight, {0}, true), "cu_seqlens needs at least 2 entries");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, weight, cu, true, Tensor({2, 4, 3})),
                                   "initial_state has shape [2, 4, 3]; expected 2 in dimension 2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, weight, cu, true, Tensor({1, 4, 2})),
                                   "initial_state has shape [1, 4, 2]; expected 2 in dimension 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_fwd(x, weight, cu, true, Tensor({2, 8})),
                                   "initial_state must have 3 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_bwd(Tensor({5, 3}), x, weight, cu, true), "dy has shape [5, 3]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::conv1d_bwd(Tensor({5, 4}), x, Tensor({4, 5}), cu, true),
                                   "conv1d_bwd: weight width W");
}

}  // namespace
}  // namespace fusepack::test
