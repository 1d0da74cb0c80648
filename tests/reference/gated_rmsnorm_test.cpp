// gated_rmsnorm reference: backward (dx, dz, dweight) vs finite differences, closed-form cases, agreement with the
// rmsnorm reference times the gate, bad arguments.
#include "reference/gated_rmsnorm.h"

#include "reference/math.h"
#include "reference/rmsnorm.h"

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

constexpr double kEps = 1e-6;

struct GatedRmsNormCase {
  std::string name;
  Shape x_shape;
};

class GatedRmsNormRef : public ::testing::TestWithParam<GatedRmsNormCase> {};

// Checks dx, dz and dweight of one random problem. z is drawn with stddev 2 so that the gate covers both the
// saturated (silu ≈ 0, silu ≈ z) and the curved part of silu; the weight is drawn around its initial value 1.
void expect_backward_matches_finite_differences(Shape const& shape, std::mt19937_64& rng) {
  Tensor x = randn_rows_away_from_zero(shape, rng, 0.5);
  Tensor z = randn(shape, rng, 2.0);
  Tensor weight = randn({shape.back()}, rng, 0.5);
  weight.flat().array() += 1.0;
  Tensor const dy = randn(shape, rng);
  auto loss = [&] { return dot(dy, ref::gated_rmsnorm_fwd(x, z, weight, kEps)); };
  ref::GatedRmsNormGrads const g = ref::gated_rmsnorm_bwd(dy, x, z, weight, kEps);
  std::string const where = " " + ref::shape_str(shape);
  FUSEPACK_EXPECT_PASS(check_gradient("dx" + where, loss, x, g.dx, plain_layout(x)));
  FUSEPACK_EXPECT_PASS(check_gradient("dz" + where, loss, z, g.dz, plain_layout(z)));
  FUSEPACK_EXPECT_PASS(check_gradient("dweight" + where, loss, weight, g.dweight));
}

TEST_P(GatedRmsNormRef, BackwardMatchesFiniteDifferences) {
  auto rng = test_rng();
  expect_backward_matches_finite_differences(GetParam().x_shape, rng);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GatedRmsNormRef,
                         ::testing::Values(GatedRmsNormCase{"one_element", {1, 1, 1}},
                                           GatedRmsNormCase{"one_row_d13", {1, 1, 13}},
                                           GatedRmsNormCase{"per_head_t3_h2_d9", {3, 2, 9}},
                                           GatedRmsNormCase{"per_head_t5_h3_d6", {5, 3, 6}},
                                           GatedRmsNormCase{"many_tokens_t17_h1_d5", {17, 1, 5}},
                                           GatedRmsNormCase{"rows4_d7", {4, 7}},
                                           GatedRmsNormCase{"zero_tokens", {0, 2, 5}}),
                         [](auto const& tc) { return tc.param.name; });

TEST(GatedRmsNormRef, BackwardMatchesFiniteDifferencesOnRandomShapes) {
  auto rng = test_rng();
  for (int c = 0; c < cases(2, 20); ++c) {
    Shape const shape{uniform_int(rng, 1, 6), uniform_int(rng, 1, 3), uniform_int(rng, 1, 17)};
    expect_backward_matches_finite_differences(shape, rng);
  }
}

TEST(GatedRmsNormRef, MatchesClosedFormWithSaturatedGate) {
  // x = (3, 4), eps = 0.5: mean(x²) + eps = 12.5 + 0.5 = 13, so x·rstd = (3, 4)/√13. z = 40: σ(40) = 1 − 4e-18
  // rounds to 1 in fp64, so silu(40) = 40 exactly; weight (2, −1) gives y = (2·3·40, −1·4·40)/√13.
  Tensor const x({1, 1, 2}, {3.0, 4.0});
  Tensor const z({1, 1, 2}, {40.0, 40.0});
  Tensor const weight({2}, {2.0, -1.0});
  Tensor const y = ref::gated_rmsnorm_fwd(x, z, weight, 0.5);
  EXPECT_NEAR(y({0, 0, 0}), 240.0 / std::sqrt(13.0), 1e-13);
  EXPECT_NEAR(y({0, 0, 1}), -160.0 / std::sqrt(13.0), 1e-13);
}

TEST(GatedRmsNormRef, ZeroGateGivesZeroOutputAndZeroDx) {
  // z = 0: silu(0) = 0, so y = 0 whatever x is, and nothing flows back into x or weight (dx = 0, dweight = 0).
  // The gate's own gradient is dz = dy·w·x·rstd·silu'(0) with silu'(0) = σ(0) = 1/2;
  // with x = (3, 4), eps = 0.5, dy = (1, 1), w = (2, −1): dz = (2·3, −1·4)/√13 · 1/2 = (3, −2)/√13.
  Tensor const x({1, 2}, {3.0, 4.0});
  Tensor const z({1, 2});
  Tensor const weight({2}, {2.0, -1.0});
  Tensor const dy({1, 2}, {1.0, 1.0});
  Tensor const y = ref::gated_rmsnorm_fwd(x, z, weight, 0.5);
  EXPECT_EQ(y({0, 0}), 0.0);
  EXPECT_EQ(y({0, 1}), 0.0);
  ref::GatedRmsNormGrads const g = ref::gated_rmsnorm_bwd(dy, x, z, weight, 0.5);
  EXPECT_EQ(g.dx({0, 0}), 0.0);
  EXPECT_EQ(g.dx({0, 1}), 0.0);
  EXPECT_EQ(g.dweight({0}), 0.0);
  EXPECT_EQ(g.dweight({1}), 0.0);
  EXPECT_NEAR(g.dz({0, 0}), 3.0 / std::sqrt(13.0), 1e-15);
  EXPECT_NEAR(g.dz({0, 1}), -2.0 / std::sqrt(13.0), 1e-15);
}

TEST(GatedRmsNormRef, EqualsRmsNormWithPlainWeightTimesSiluGate) {
  // The zero-centred rmsnorm reference with weight w − 1 has gain 1 + (w − 1) = w: gated_rmsnorm must be that
  // output times silu(z), up to the rounding of 1 + (w − 1) (one ulp of w, so 1e-14 on O(10) outputs).
  auto rng = test_rng();
  Shape const shape{4, 3, 10};
  Tensor const x = randn(shape, rng, 2.0);
  Tensor const z = randn(shape, rng, 2.0);
  Tensor weight = randn({10}, rng, 0.5);
  weight.flat().array() += 1.0;
  Tensor weight_minus_one = weight;
  weight_minus_one.flat().array() -= 1.0;
  Tensor const y = ref::gated_rmsnorm_fwd(x, z, weight, kEps);
  Tensor expected = ref::rmsnorm_fwd(x, weight_minus_one, kEps);
  for (Index i = 0; i < expected.numel(); ++i) expected.data()[i] *= ref::silu(z.data()[i]);
  FUSEPACK_EXPECT_PASS(compare_allclose("y vs rmsnorm·silu(z)", y, expected, Tolerance{1e-14, 1e-14}, plain_layout(y)));
}

TEST(GatedRmsNormRef, RejectsBadArguments) {
  Tensor const x({2, 3, 4});
  Tensor const z({2, 3, 4});
  Tensor const w({4});
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_fwd(x, Tensor({2, 3, 5}), w, kEps),
                                   "z has shape [2, 3, 5]; expected 4 in dimension 2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_fwd(x, Tensor({6, 4}), w, kEps), "z must have 3 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_fwd(x, Tensor(), w, kEps), "z is required");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_fwd(x, z, Tensor({3}), kEps), "weight has shape [3]; expected 4");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_fwd(x, z, Tensor({1, 4}), kEps), "weight must have 1 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_fwd(x, z, w, 0.0), "eps must be > 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_fwd(x, z, w, -1e-6), "eps must be > 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_fwd(Tensor(), z, w, kEps), "x must have at least 1 dimension");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_bwd(Tensor({2, 3, 5}), x, z, w, kEps), "dy has shape [2, 3, 5]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_bwd(Tensor({2, 3, 4}), x, Tensor({2, 2, 4}), w, kEps),
                                   "gated_rmsnorm_bwd: z has shape [2, 2, 4]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::gated_rmsnorm_bwd(Tensor({2, 3, 4}), x, z, w, 0.0), "eps must be > 0");
}

}  // namespace
}  // namespace fusepack::test
