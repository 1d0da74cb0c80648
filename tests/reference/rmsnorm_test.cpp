// rmsnorm reference: backward vs finite differences, a closed-form case, bad arguments.
#include "reference/rmsnorm.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "verify/gradcheck.h"
#include "verify/random.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fusepack::test {
namespace {

using ref::Shape;
using ref::Tensor;

constexpr double kEps = 1e-6;

struct RmsNormCase {
  std::string name;
  Shape x_shape;
};

class RmsNormRef : public ::testing::TestWithParam<RmsNormCase> {};

TEST_P(RmsNormRef, BackwardMatchesFiniteDifferences) {
  auto rng = test_rng();
  Shape const shape = GetParam().x_shape;
  Tensor x = randn_rows_away_from_zero(shape, rng, 0.5);
  Tensor weight = randn({shape.back()}, rng, 0.5);
  Tensor const dy = randn(shape, rng);
  auto loss = [&] { return dot(dy, ref::rmsnorm_fwd(x, weight, kEps)); };
  ref::RmsNormGrads const g = ref::rmsnorm_bwd(dy, x, weight, kEps);
  FUSEPACK_EXPECT_PASS(check_gradient("dx", loss, x, g.dx, plain_layout(x)));
  FUSEPACK_EXPECT_PASS(check_gradient("dweight", loss, weight, g.dweight));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormRef,
                         ::testing::Values(RmsNormCase{"one_element", {1, 1}}, RmsNormCase{"rows5_d7", {5, 7}},
                                           RmsNormCase{"per_head_t3_h2_d9", {3, 2, 9}},
                                           RmsNormCase{"one_row_d13", {1, 13}},
                                           RmsNormCase{"vector_d6", {6}}),
                         [](auto const& tc) { return tc.param.name; });

TEST(RmsNormRef, BackwardMatchesFiniteDifferencesOnRandomShapes) {
  auto rng = test_rng();
  for (int c = 0; c < cases(2, 20); ++c) {
    Shape const shape{uniform_int(rng, 1, 6), uniform_int(rng, 1, 3), uniform_int(rng, 1, 17)};
    Tensor x = randn_rows_away_from_zero(shape, rng, 0.5);
    Tensor weight = randn({shape.back()}, rng, 0.5);
    Tensor const dy = randn(shape, rng);
    auto loss = [&] { return dot(dy, ref::rmsnorm_fwd(x, weight, kEps)); };
    ref::RmsNormGrads const g = ref::rmsnorm_bwd(dy, x, weight, kEps);
    FUSEPACK_EXPECT_PASS(check_gradient("dx " + ref::shape_str(shape), loss, x, g.dx, plain_layout(x)));
    FUSEPACK_EXPECT_PASS(check_gradient("dweight " + ref::shape_str(shape), loss, weight, g.dweight));
  }
}

TEST(RmsNormRef, MatchesClosedFormCase) {
  // x = (3, 4), eps = 0.5: mean(x²) + eps = 12.5 + 0.5 = 13, so x·rstd = (3, 4)/√13;
  // weight (1, −0.5) gives gains 1+w = (2, 0.5): y = (6/√13, 2/√13).
  Tensor const x({1, 2}, {3.0, 4.0});
  Tensor const weight({2}, {1.0, -0.5});
  Tensor const y = ref::rmsnorm_fwd(x, weight, 0.5);
  EXPECT_NEAR(y({0, 0}), 6.0 / std::sqrt(13.0), 1e-15);
  EXPECT_NEAR(y({0, 1}), 2.0 / std::sqrt(13.0), 1e-15);
}

TEST(RmsNormRef, ZeroWeightIsTheIdentityGainAndTheOutputHasUnitRms) {
  auto rng = test_rng();
  Tensor const x = randn({4, 32}, rng, 3.0);
  Tensor const y = ref::rmsnorm_fwd(x, Tensor({32}), 1e-12);
  for (ref::Index r = 0; r < 4; ++r) EXPECT_NEAR(y.vec({r}).squaredNorm() / 32, 1.0, 1e-9);
}

TEST(RmsNormRef, RejectsBadArguments) {
  Tensor const x({2, 4});
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rmsnorm_fwd(x, Tensor({3}), kEps), "weight has shape [3]; expected 4");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rmsnorm_fwd(x, Tensor({4}), 0.0), "eps must be > 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rmsnorm_fwd(Tensor(), Tensor({4}), kEps), "x must have at least 1 dimension");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rmsnorm_bwd(Tensor({2, 5}), x, Tensor({4}), kEps), "dy has shape [2, 5]");
}

}  // namespace
}  // namespace fusepack::test
