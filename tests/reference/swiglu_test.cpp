// swiglu reference: backward vs finite differences (with gates up to ±30), closed-form values, finiteness for
// saturated gates, bad arguments.
#include "reference/swiglu.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "verify/gradcheck.h"
#include "verify/random.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace fusepack::test {
namespace {

using ref::Index;
using ref::Shape;
using ref::Tensor;

// σ(1) = 1/(1 + e^−1) = e/(1 + e), evaluated with mpmath at 30 digits (0.731058578630004879251...) and rounded
// to the nearest double; silu'(1) = σ(1)·(1 + 1·(1 − σ(1))) = σ(1)·(2 − σ(1)) = 0.927670511871486731788... likewise.
constexpr double kSigmoidOne = 0.7310585786300049;
constexpr double kSiluGradOne = 0.9276705118714867;

struct SwiGluCase {
  std::string name;
  Shape shape;
  double gate_range;  // gate ~ uniform(−gate_range, gate_range)
};

class SwiGluRef : public ::testing::TestWithParam<SwiGluCase> {};

void expect_backward_matches_finite_differences(Shape const& shape, double gate_range, std::mt19937_64& rng) {
  Tensor gate = uniform(shape, rng, -gate_range, gate_range);
  Tensor up = randn(shape, rng);
  Tensor const dy = randn(shape, rng);
  auto loss = [&] { return dot(dy, ref::swiglu_fwd(gate, up)); };
  ref::SwiGluGrads const g = ref::swiglu_bwd(dy, gate, up);
  std::string const where = " " + ref::shape_str(shape);
  FUSEPACK_EXPECT_PASS(check_gradient("dgate" + where, loss, gate, g.dgate, plain_layout(gate)));
  FUSEPACK_EXPECT_PASS(check_gradient("dup" + where, loss, up, g.dup, plain_layout(up)));
}

TEST_P(SwiGluRef, BackwardMatchesFiniteDifferences) {
  auto rng = test_rng();
  expect_backward_matches_finite_differences(GetParam().shape, GetParam().gate_range, rng);
}

// Gates of ±30 cover both tails: silu(−30) ≈ −3e-12 and silu'(30) ≈ 1; the finite differences there are still exact
// to ~1e-9 (|silu'''| ≤ 1, |loss| ≲ 1e3).
INSTANTIATE_TEST_SUITE_P(Shapes, SwiGluRef,
                         ::testing::Values(SwiGluCase{"one_element", {1}, 3.0}, SwiGluCase{"t1_i7", {1, 7}, 3.0},
                                           SwiGluCase{"t5_i11", {5, 11}, 4.0},
                                           SwiGluCase{"t3_i13_large_gates", {3, 13}, 30.0},
                                           SwiGluCase{"rank3_2_3_5", {2, 3, 5}, 6.0},
                                           SwiGluCase{"zero_tokens", {0, 9}, 3.0}),
                         [](auto const& tc) { return tc.param.name; });

TEST(SwiGluRef, BackwardMatchesFiniteDifferencesOnRandomShapes) {
  auto rng = test_rng();
  for (int c = 0; c < cases(3, 30); ++c) {
    Shape const shape{uniform_int(rng, 1, 9), uniform_int(rng, 1, 19)};
    expect_backward_matches_finite_differences(shape, uniform_int(rng, 1, 30), rng);
  }
}

TEST(SwiGluRef, MatchesClosedFormAtZeroAndOne) {
  // gate = 0: silu(0) = 0·σ(0) = 0 so y = 0 and dup = 0; silu'(0) = σ(0) = 1/2, so dgate = dy·up/2.
  // gate = 1: silu(1) = σ(1) = 0.7310585786300049 (see kSigmoidOne), so y = up·σ(1), dup = dy·σ(1),
  //           dgate = dy·up·silu'(1).
  Tensor const gate({2}, {0.0, 1.0});
  Tensor const up({2}, {3.0, -2.0});
  Tensor const dy({2}, {5.0, 0.5});
  Tensor const y = ref::swiglu_fwd(gate, up);
  EXPECT_EQ(y({0}), 0.0);
  EXPECT_NEAR(y({1}), -2.0 * kSigmoidOne, 1e-15);
  ref::SwiGluGrads const g = ref::swiglu_bwd(dy, gate, up);
  EXPECT_EQ(g.dup({0}), 0.0);
  EXPECT_NEAR(g.dgate({0}), 5.0 * 3.0 / 2.0, 1e-15);
  EXPECT_NEAR(g.dup({1}), 0.5 * kSigmoidOne, 1e-15);
  EXPECT_NEAR(g.dgate({1}), 0.5 * -2.0 * kSiluGradOne, 1e-15);
}

TEST(SwiGluRef, StaysFiniteForSaturatedGates) {
  // σ(±x) saturates to exactly 0 or 1 in fp64 for large |x| (e^1000 overflows to inf, 1/(1+inf) = 0): silu(x) → 0
  // for x → −∞ and → x for x → +∞, silu'(x) → 0 and → 1, never NaN.
  Tensor const gate({6}, {-1000.0, -745.0, -30.0, 30.0, 745.0, 1000.0});
  Tensor const up({6}, {1.0, 1.0, 1.0, 1.0, 1.0, 1.0});
  Tensor const dy({6}, {1.0, 1.0, 1.0, 1.0, 1.0, 1.0});
  Tensor const y = ref::swiglu_fwd(gate, up);
  ref::SwiGluGrads const g = ref::swiglu_bwd(dy, gate, up);
  for (Index i = 0; i < 6; ++i) {
    EXPECT_TRUE(std::isfinite(y({i}))) << "gate " << gate({i});
    EXPECT_TRUE(std::isfinite(g.dgate({i}))) << "gate " << gate({i});
    EXPECT_TRUE(std::isfinite(g.dup({i}))) << "gate " << gate({i});
  }
  EXPECT_EQ(y({0}), 0.0);
  EXPECT_EQ(g.dgate({0}), 0.0);
  EXPECT_EQ(y({5}), 1000.0);
  EXPECT_EQ(g.dgate({5}), 1.0);
  // silu(−30) = −30/(1 + e^30) ≈ −2.8e-12; silu'(x) = σ + x·σ(1 − σ) ≈ 1 + (x − 1)·e^−x for large x,
  // so silu'(30) ≈ 1 + 2.7e-12 (silu' overshoots 1 for x > 0). Tolerance 1e-14: 1 − σ(30) ≈ 9e-14 is computed by
  // cancellation with an absolute error of ~1e-16, which x = 30 scales to ~3e-15 (measured 2.7e-15).
  EXPECT_NEAR(y({2}), -30.0 / (1.0 + std::exp(30.0)), 1e-25);
  EXPECT_NEAR(g.dgate({3}), 1.0 + 29.0 * std::exp(-30.0), 1e-14);
}

TEST(SwiGluRef, RejectsBadArguments) {
  Tensor const gate({3, 4});
  Tensor const up({3, 4});
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::swiglu_fwd(gate, Tensor({3, 5})), "up has shape [3, 5]; expected 4");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::swiglu_fwd(gate, Tensor({12})), "up must have 2 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::swiglu_fwd(gate, Tensor()), "up is required");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::swiglu_fwd(Tensor(), up), "gate is required");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::swiglu_bwd(Tensor({2, 4}), gate, up), "dy has shape [2, 4]; expected 3");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::swiglu_bwd(Tensor({3, 4}), gate, Tensor({4, 3})),
                                   "swiglu_bwd: up has shape [4, 3]");
}

}  // namespace
}  // namespace fusepack::test
