// rope reference: backward vs finite differences, closed forms (position 0, one radian per position, the theta
// exponent), norm preservation, packed == examples stitched, T = 0, bad arguments.
#include "reference/rope.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "verify/gradcheck.h"
#include "verify/random.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using ref::Index;
using ref::Tensor;

using Positions = std::vector<std::int64_t>;

// Positions of a pack of examples with the given lengths: 0, 1, …, L−1 for each example in turn.
Positions packed_positions(std::vector<int> const& lengths) {
  Positions pos;
  for (int len : lengths) {
    for (int p = 0; p < len; ++p) pos.push_back(p);
  }
  return pos;
}

struct RopeCase {
  std::string name;
  Index H, D, rotary_dim;
  double theta;
  Positions position_ids;  // T = its length
};

class RopeRef : public ::testing::TestWithParam<RopeCase> {};

void expect_backward_matches_finite_differences(RopeCase const& tc, std::mt19937_64& rng) {
  Index const T = static_cast<Index>(tc.position_ids.size());
  Tensor x = randn({T, tc.H, tc.D}, rng);
  Tensor const dy = randn({T, tc.H, tc.D}, rng);
  auto loss = [&] { return dot(dy, ref::rope_fwd(x, tc.position_ids, tc.rotary_dim, tc.theta)); };
  Tensor const dx = ref::rope_bwd(dy, tc.position_ids, tc.rotary_dim, tc.theta);
  std::string const where = " " + ref::shape_str(x.shape()) + " rotary_dim " + std::to_string(tc.rotary_dim);
  FUSEPACK_EXPECT_PASS(check_gradient("dx" + where, loss, x, dx, plain_layout(x)));
}

TEST_P(RopeRef, BackwardMatchesFiniteDifferences) {
  auto rng = test_rng();
  expect_backward_matches_finite_differences(GetParam(), rng);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RopeRef,
    ::testing::Values(RopeCase{"one_token_d2_r2", 1, 2, 2, 10000.0, {3}},
                      RopeCase{"full_rotary_d6_r6_h1", 1, 6, 6, 10000.0, {0, 1, 2, 3, 4}},
                      RopeCase{"partial_d10_r4_h3_packed", 3, 10, 4, 10000.0, packed_positions({3, 1, 2})},
                      RopeCase{"partial_d7_r2_h5_many_tiny", 5, 7, 2, 500.0, packed_positions({1, 1, 2, 1, 1})},
                      RopeCase{"large_positions_d8_r8", 2, 8, 8, 1e6, {100000, 262143, 7}},
                      RopeCase{"qwen35_d256_r64_theta1e7", 1, 256, 64, 1e7, {0, 1, 4095}},
                      RopeCase{"zero_tokens", 3, 10, 4, 10000.0, {}}),
    [](auto const& tc) { return tc.param.name; });

TEST(RopeRef, BackwardMatchesFiniteDifferencesOnRandomShapes) {
  auto rng = test_rng();
  for (int c = 0; c < cases(3, 40); ++c) {
    int const D = uniform_int(rng, 2, 24);  // odd head dims too
    int const rotary_dim = 2 * uniform_int(rng, 1, D / 2);
    std::vector<int> const lengths = random_lengths(rng, uniform_int(rng, 1, 3), 1, 4);
    RopeCase const tc{"random", uniform_int(rng, 1, 3), D, rotary_dim, std::pow(10.0, uniform_int(rng, 1, 7)),
                      packed_positions(lengths)};
    expect_backward_matches_finite_differences(tc, rng);
  }
}

TEST(RopeRef, BackwardIsTheInverseRotation) {
  // dx = R(−a)·dy and the forward is R(a), so bwd(fwd(x)) = x up to rounding of a few ulps.
  auto rng = test_rng();
  Positions const pos{0, 5, 17, 4095, 1};
  Tensor const x = randn({5, 3, 10}, rng);
  Tensor const back = ref::rope_bwd(ref::rope_fwd(x, pos, 6, 1e4), pos, 6, 1e4);
  FUSEPACK_EXPECT_PASS(compare_allclose("bwd(fwd(x)) vs x", back, x, {1e-14, 1e-14}, plain_layout(x)));
}

TEST(RopeRef, PositionZeroIsTheIdentity) {
  // a = 0·inv_freq = 0 for every pair: cos 0 = 1 and sin 0 = 0 exactly, so y = x bit for bit.
  auto rng = test_rng();
  Tensor const x = randn({2, 3, 10}, rng);
  Tensor const y = ref::rope_fwd(x, {0, 0}, 6, 1e4);
  EXPECT_EQ(y.flat(), x.flat());
  EXPECT_EQ(ref::rope_bwd(x, {0, 0}, 6, 1e4).flat(), x.flat());
}

TEST(RopeRef, MatchesClosedFormOneRadianPerPositionWhenRotaryDimIsTwo) {
  // rotary_dim = 2: one pair (0, 1) with inv_freq[0] = theta^0 = 1, so position p rotates (x0, x1) by exactly p
  // radians: (x0 cos p − x1 sin p, x1 cos p + x0 sin p); channels 2.. pass through.
  Tensor const x({2, 1, 3}, {1.0, 2.0, 3.0, -0.5, 4.0, 7.0});
  Positions const pos{1, 3};
  Tensor const y = ref::rope_fwd(x, pos, 2, 1e7);
  for (Index t = 0; t < 2; ++t) {
    double const p = static_cast<double>(pos[t]), x0 = x({t, 0, 0}), x1 = x({t, 0, 1});
    EXPECT_NEAR(y({t, 0, 0}), x0 * std::cos(p) - x1 * std::sin(p), 1e-15);
    EXPECT_NEAR(y({t, 0, 1}), x1 * std::cos(p) + x0 * std::sin(p), 1e-15);
    EXPECT_EQ(y({t, 0, 2}), x({t, 0, 2}));
  }
  // Position 1 on (1, 2): (cos 1 − 2 sin 1, 2 cos 1 + sin 1) = (−1.142639…, 1.922075…) (values by hand from
  // cos 1 = 0.5403023058681398, sin 1 = 0.8414709848078965).
  EXPECT_NEAR(y({0, 0, 0}), 0.5403023058681398 - 2 * 0.8414709848078965, 1e-15);
  EXPECT_NEAR(y({0, 0, 1}), 2 * 0.5403023058681398 + 0.8414709848078965, 1e-15);
}

TEST(RopeRef, MatchesClosedFormThetaExponentAndHalfSplitPairs) {
  // rotary_dim = 4, theta = 100: inv_freq = (100^0, 100^(−2/4)) = (1, 0.1). At position 10 pair (0, 2) turns by
  // 10 rad and pair (1, 3) by exactly 1 rad; the pairs are half-split (i, i + 2), not interleaved (2i, 2i + 1).
  // x = e1 (only channel 1 set) therefore lands on channels 1 and 3 as (cos 1, sin 1); channel 4 passes through.
  Tensor const x({1, 1, 5}, {0.0, 1.0, 0.0, 0.0, 9.0});
  Tensor const y = ref::rope_fwd(x, {10}, 4, 100.0);
  EXPECT_NEAR(y({0, 0, 0}), 0.0, 1e-15);
  EXPECT_NEAR(y({0, 0, 1}), std::cos(1.0), 1e-15);
  EXPECT_NEAR(y({0, 0, 2}), 0.0, 1e-15);
  EXPECT_NEAR(y({0, 0, 3}), std::sin(1.0), 1e-15);
  EXPECT_EQ(y({0, 0, 4}), 9.0);
}

TEST(RopeRef, PreservesTheNormOfEveryRotatedPairAndPassesTheRestThrough) {
  // Qwen3.5's attention shape: D = 256, rotary_dim 64, theta 1e7; channels 64..255 must be untouched.
  auto rng = test_rng();
  Index const T = 4, H = 3, D = 256, R = 64;
  Positions const pos{0, 1, 1000, 262143};
  Tensor const x = randn({T, H, D}, rng);
  Tensor const y = ref::rope_fwd(x, pos, R, 1e7);
  for (Index t = 0; t < T; ++t) {
    for (Index h = 0; h < H; ++h) {
      for (Index i = 0; i < R / 2; ++i) {
        double const before = std::hypot(x({t, h, i}), x({t, h, i + R / 2}));
        double const after = std::hypot(y({t, h, i}), y({t, h, i + R / 2}));
        EXPECT_NEAR(after, before, 1e-14 * (1 + before)) << "t " << t << " h " << h << " pair " << i;
      }
      for (Index c = R; c < D; ++c) ASSERT_EQ(y({t, h, c}), x({t, h, c})) << "t " << t << " h " << h << " c " << c;
    }
  }
}

TEST(RopeRef, PackedEqualsExamplesStitched) {
  // A pack whose positions restart at 0 per example is rope over each example alone, concatenated: the same
  // arithmetic on the same values, so the results agree bit for bit (forward and backward).
  auto rng = test_rng();
  std::vector<int> const lengths{3, 1, 5, 2};
  Index const H = 3, D = 10, R = 4;
  double const theta = 1e4;
  std::vector<std::int32_t> const cu = cu_seqlens_from_lengths(lengths);
  Positions const pos = packed_positions(lengths);
  Index const T = cu.back();
  Tensor const x = randn({T, H, D}, rng);
  Tensor const dy = randn({T, H, D}, rng);
  Tensor const y = ref::rope_fwd(x, pos, R, theta);
  Tensor const dx = ref::rope_bwd(dy, pos, R, theta);
  Tensor y_stitched({T, H, D}), dx_stitched({T, H, D});
  for (size_t n = 0; n < lengths.size(); ++n) {
    Index const start = cu[n], len = lengths[n], row = H * D;
    Tensor xe({len, H, D}), dye({len, H, D});
    xe.flat() = x.flat().segment(start * row, len * row);
    dye.flat() = dy.flat().segment(start * row, len * row);
    Positions const alone = packed_positions({lengths[n]});
    y_stitched.flat().segment(start * row, len * row) = ref::rope_fwd(xe, alone, R, theta).flat();
    dx_stitched.flat().segment(start * row, len * row) = ref::rope_bwd(dye, alone, R, theta).flat();
  }
  FUSEPACK_EXPECT_PASS(compare_allclose("y packed vs stitched", y, y_stitched, {0, 0}, packed_layout(y, cu)));
  FUSEPACK_EXPECT_PASS(compare_allclose("dx packed vs stitched", dx, dx_stitched, {0, 0}, packed_layout(dx, cu)));
}

TEST(RopeRef, PositionsThatDoNotRestartChangeTheResult) {
  // The converse of PackedEqualsExamplesStitched, so that it can fail: continuing positions across the boundary
  // (a leaky packing) rotates the second example's tokens differently.
  auto rng = test_rng();
  Tensor const x = randn({4, 1, 4}, rng);
  Tensor const restart = ref::rope_fwd(x, {0, 1, 0, 1}, 4, 1e4);
  Tensor const leaky = ref::rope_fwd(x, {0, 1, 2, 3}, 4, 1e4);
  EXPECT_EQ(restart.vec({0, 0}), leaky.vec({0, 0}));
  EXPECT_GT((restart.vec({2, 0}) - leaky.vec({2, 0})).norm(), 1e-3);
}

TEST(RopeRef, HandlesZeroTokens) {
  Tensor const y = ref::rope_fwd(Tensor({0, 2, 6}), {}, 6, 1e4);
  EXPECT_EQ(y.shape(), (ref::Shape{0, 2, 6}));
  EXPECT_EQ(ref::rope_bwd(Tensor({0, 2, 6}), {}, 6, 1e4).shape(), (ref::Shape{0, 2, 6}));
}

TEST(RopeRef, RejectsBadArguments) {
  Tensor const x({2, 3, 10});
  Positions const pos{0, 1};
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_fwd(x, pos, 3, 1e4), "rotary_dim must be even; got 3");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_fwd(x, pos, 12, 1e4), "rotary_dim must be in 2..10");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_fwd(x, pos, 0, 1e4), "got 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_fwd(x, pos, -2, 1e4), "rotary_dim must be in 2..10");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_fwd(x, {0, 1, 2}, 4, 1e4), "position_ids has 3 entries; expected T=2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_fwd(x, {0, -1}, 4, 1e4), "position_ids[1]=-1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_fwd(x, pos, 4, 0.0), "theta must be > 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_fwd(x, pos, 4, -1e4), "theta must be > 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_fwd(Tensor({2, 30}), pos, 4, 1e4), "x must have 3 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_fwd(Tensor(), pos, 4, 1e4), "x is required");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_bwd(Tensor({2, 3, 10, 1}), pos, 4, 1e4), "dy must have 3 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::rope_bwd(x, {5}, 4, 1e4), "rope_bwd: position_ids has 1 entries");
}

}  // namespace
}  // namespace fusepack::test
