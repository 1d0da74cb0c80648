// cross_entropy reference: dlogits vs finite differences (ignored rows, custom ignore_index, T = 0), closed-form
// losses and gradients, stability for large logits, target counting, bad arguments.
#include "reference/cross_entropy.h"

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
using Labels = std::vector<std::int64_t>;

// σ(1) = 1/(1 + e^−1), from mpmath at 30 digits (0.731058578630004879251...), rounded to the nearest double.
constexpr double kSigmoidOne = 0.7310585786300049;

struct CrossEntropyCase {
  std::string name;
  Index T, vocab;
  std::vector<Index> ignored_rows;  // rows whose label is ignore_index
  std::int64_t ignore_index = ref::kIgnoreIndex;
};

class CrossEntropyRef : public ::testing::TestWithParam<CrossEntropyCase> {};

// Random labels in [0, vocab), except ignore_index on the ignored rows. A label equal to an in-vocabulary
// ignore_index would be ignored too, so such labels are drawn again.
Labels random_labels(Index T, Index vocab, std::vector<Index> const& ignored_rows, std::int64_t ignore_index,
                     std::mt19937_64& rng) {
  Labels labels(T);
  for (auto& label : labels) {
    do {
      label = uniform_int(rng, 0, static_cast<int>(vocab) - 1);
    } while (label == ignore_index);
  }
  for (Index t : ignored_rows) labels[t] = ignore_index;
  return labels;
}

// Logits with stddev 2 (softmax far from uniform) and dloss_sum = 0.7 (so the backward's scaling is checked).
void expect_backward_matches_finite_differences(Index T, Index vocab, Labels const& labels, std::int64_t ignore_index,
                                                std::mt19937_64& rng) {
  double const dloss_sum = 0.7;
  Tensor logits = randn({T, vocab}, rng, 2.0);
  auto loss = [&] { return dloss_sum * ref::cross_entropy_fwd(logits, labels, ignore_index).loss_sum; };
  Tensor const dlogits = ref::cross_entropy_bwd(dloss_sum, logits, labels, ignore_index);
  FUSEPACK_EXPECT_PASS(
      check_gradient("dlogits " + ref::shape_str(logits.shape()), loss, logits, dlogits, plain_layout(logits)));
}

TEST_P(CrossEntropyRef, BackwardMatchesFiniteDifferences) {
  auto rng = test_rng();
  CrossEntropyCase const& c = GetParam();
  Labels const labels = random_labels(c.T, c.vocab, c.ignored_rows, c.ignore_index, rng);
  expect_backward_matches_finite_differences(c.T, c.vocab, labels, c.ignore_index, rng);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CrossEntropyRef,
    ::testing::Values(CrossEntropyCase{"one_token_vocab1", 1, 1, {}}, CrossEntropyCase{"one_token_vocab5", 1, 5, {}},
                      CrossEntropyCase{"two_classes_t3", 3, 2, {}},
                      CrossEntropyCase{"t4_vocab7_one_ignored", 4, 7, {1}},
                      CrossEntropyCase{"t6_vocab13_half_ignored", 6, 13, {0, 2, 4}},
                      CrossEntropyCase{"t3_vocab6_all_ignored", 3, 6, {0, 1, 2}},
                      CrossEntropyCase{"zero_tokens_vocab5", 0, 5, {}},
                      CrossEntropyCase{"ignore_index_minus1", 5, 9, {0, 3}, -1},
                      CrossEntropyCase{"ignore_index_in_vocab", 5, 6, {2}, 4}),
    [](auto const& tc) { return tc.param.name; });

TEST(CrossEntropyRef, BackwardMatchesFiniteDifferencesOnRandomShapes) {
  auto rng = test_rng();
  for (int c = 0; c < cases(3, 30); ++c) {
    Index const T = uniform_int(rng, 0, 7), vocab = uniform_int(rng, 1, 23);
    std::vector<Index> ignored;
    for (Index t = 0; t < T; ++t) {
      if (uniform_int(rng, 0, 3) == 0) ignored.push_back(t);
    }
    Labels const labels = random_labels(T, vocab, ignored, ref::kIgnoreIndex, rng);
    expect_backward_matches_finite_differences(T, vocab, labels, ref::kIgnoreIndex, rng);
  }
}

TEST(CrossEntropyRef, UniformLogitsGiveLogVocabPerTarget) {
  // Equal logits: softmax = 1/vocab everywhere, so each target costs −ln(1/vocab) = ln(vocab), whatever the label
  // and the common value; 3 targets (one row ignored) give 3·ln 7, and dlogits = dloss_sum·(1/7 − onehot).
  Tensor logits({4, 7});
  logits.flat().setConstant(3.7);
  Labels const labels{0, ref::kIgnoreIndex, 6, 3};
  ref::CrossEntropyOut const out = ref::cross_entropy_fwd(logits, labels);
  EXPECT_EQ(out.num_targets, 3);
  EXPECT_NEAR(out.loss_sum, 3.0 * std::log(7.0), 1e-14);
  Tensor const dlogits = ref::cross_entropy_bwd(2.0, logits, labels);
  for (Index t = 0; t < 4; ++t) {
    for (Index j = 0; j < 7; ++j) {
      double const expected = labels[t] == ref::kIgnoreIndex ? 0.0 : 2.0 * (1.0 / 7.0 - (labels[t] == j ? 1.0 : 0.0));
      EXPECT_NEAR(dlogits({t, j}), expected, 1e-15) << "row " << t << ", class " << j;
    }
  }
}

TEST(CrossEntropyRef, MatchesClosedFormTwoClasses) {
  // Logits (0, ln 3): softmax = (1, 3)/(1 + 3) = (1/4, 3/4). Label 1 costs −ln(3/4), label 0 costs −ln(1/4) = ln 4;
  // the gradient of the label-1 row is softmax − onehot = (1/4, −1/4).
  Tensor const logits({2, 2}, {0.0, std::log(3.0), 0.0, std::log(3.0)});
  ref::CrossEntropyOut const one = ref::cross_entropy_fwd(logits, {1, ref::kIgnoreIndex});
  EXPECT_EQ(one.num_targets, 1);
  EXPECT_NEAR(one.loss_sum, -std::log(0.75), 1e-15);
  ref::CrossEntropyOut const both = ref::cross_entropy_fwd(logits, {1, 0});
  EXPECT_EQ(both.num_targets, 2);
  EXPECT_NEAR(both.loss_sum, -std::log(0.75) + std::log(4.0), 1e-15);
  Tensor const dlogits = ref::cross_entropy_bwd(1.0, logits, {1, ref::kIgnoreIndex});
  EXPECT_NEAR(dlogits({0, 0}), 0.25, 1e-15);
  EXPECT_NEAR(dlogits({0, 1}), -0.25, 1e-15);
  EXPECT_EQ(dlogits({1, 0}), 0.0);
  EXPECT_EQ(dlogits({1, 1}), 0.0);
}

TEST(CrossEntropyRef, StaysFiniteAndExactForLargeLogits) {
  // Row (1000, −1000, 0, 999): exp(1000) overflows, so only the max-subtracted logsumexp works. It is
  // 1000 + ln(1 + e^−2000 + e^−1000 + e^−1) = 1000 + ln(1 + e^−1) in fp64, hence label 0 costs ln(1 + e^−1) =
  // −ln σ(1) and label 1 costs 2000 − ln σ(1). softmax = (σ(1), 0, 0, 1 − σ(1)) up to e^−1000 terms.
  Tensor const logits({2, 4}, {1000.0, -1000.0, 0.0, 999.0, 1000.0, -1000.0, 0.0, 999.0});
  Labels const labels{0, 1};
  ref::CrossEntropyOut const out = ref::cross_entropy_fwd(logits, labels);
  ASSERT_TRUE(std::isfinite(out.loss_sum));
  EXPECT_NEAR(out.loss_sum, 2000.0 - 2.0 * std::log(kSigmoidOne), 1e-12);
  ref::CrossEntropyOut const first = ref::cross_entropy_fwd(logits, {0, ref::kIgnoreIndex});
  EXPECT_NEAR(first.loss_sum, -std::log(kSigmoidOne), 1e-15);
  Tensor const dlogits = ref::cross_entropy_bwd(1.0, logits, labels);
  for (Index i = 0; i < dlogits.numel(); ++i) ASSERT_TRUE(std::isfinite(dlogits.data()[i])) << "element " << i;
  EXPECT_NEAR(dlogits({0, 0}), kSigmoidOne - 1.0, 1e-15);
  EXPECT_NEAR(dlogits({0, 3}), 1.0 - kSigmoidOne, 1e-15);
  EXPECT_NEAR(dlogits({1, 0}), kSigmoidOne, 1e-15);
  EXPECT_NEAR(dlogits({1, 1}), -1.0, 1e-15);
  EXPECT_EQ(dlogits({0, 1}), 0.0);  // e^−2000 underflows to exactly 0
}

TEST(CrossEntropyRef, CountsEveryNonIgnoredLabel) {
  auto rng = test_rng();
  for (int c = 0; c < cases(3, 30); ++c) {
    Index const T = uniform_int(rng, 0, 40), vocab = uniform_int(rng, 1, 11);
    Labels labels(T);
    Index expected = 0;
    for (auto& label : labels) {
      bool const ignored = uniform_int(rng, 0, 2) == 0;
      label = ignored ? ref::kIgnoreIndex : uniform_int(rng, 0, static_cast<int>(vocab) - 1);
      expected += ignored ? 0 : 1;
    }
    EXPECT_EQ(ref::cross_entropy_fwd(randn({T, vocab}, rng), labels).num_targets, expected) << "T=" << T;
  }
}

TEST(CrossEntropyRef, AllRowsIgnoredGiveZeroLossZeroCountZeroGradient) {
  auto rng = test_rng();
  Tensor const logits = randn({3, 5}, rng, 3.0);
  Labels const labels(3, ref::kIgnoreIndex);
  ref::CrossEntropyOut const out = ref::cross_entropy_fwd(logits, labels);
  EXPECT_EQ(out.loss_sum, 0.0);
  EXPECT_EQ(out.num_targets, 0);
  Tensor const dlogits = ref::cross_entropy_bwd(1.0, logits, labels);
  EXPECT_EQ(dlogits.shape(), logits.shape());
  EXPECT_EQ(dlogits.flat().cwiseAbs().maxCoeff(), 0.0);
}

TEST(CrossEntropyRef, AcceptsZeroTokens) {
  Tensor const logits({0, 5});
  ref::CrossEntropyOut const out = ref::cross_entropy_fwd(logits, {});
  EXPECT_EQ(out.loss_sum, 0.0);
  EXPECT_EQ(out.num_targets, 0);
  EXPECT_EQ(ref::cross_entropy_bwd(1.0, logits, {}).shape(), (ref::Shape{0, 5}));
}

TEST(CrossEntropyRef, CustomIgnoreIndexSkipsItsRowsOnly) {
  // ignore_index −1: the rows labelled −1 drop out, so the result equals that of the remaining rows alone; −100 is
  // then an ordinary (invalid) label.
  auto rng = test_rng();
  Tensor const logits = randn({3, 4}, rng, 2.0);
  ref::CrossEntropyOut const out = ref::cross_entropy_fwd(logits, {2, -1, 0}, -1);
  Tensor kept({2, 4});
  kept.vec({0}) = logits.vec({0});
  kept.vec({1}) = logits.vec({2});
  ref::CrossEntropyOut const alone = ref::cross_entropy_fwd(kept, {2, 0});
  EXPECT_EQ(out.num_targets, 2);
  EXPECT_EQ(out.loss_sum, alone.loss_sum);
  Tensor const dlogits = ref::cross_entropy_bwd(1.0, logits, {2, -1, 0}, -1);
  EXPECT_EQ(dlogits.vec({1}).cwiseAbs().maxCoeff(), 0.0);
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_fwd(logits, {2, ref::kIgnoreIndex, 0}, -1),
                                   "labels[1]=-100 is outside the vocabulary [0, 4) and is not ignore_index=-1");
  // An ignore_index inside the vocabulary ignores that class id.
  EXPECT_EQ(ref::cross_entropy_fwd(logits, {2, 3, 3}, 3).num_targets, 1);
}

TEST(CrossEntropyRef, RejectsBadArguments) {
  Tensor const logits({3, 5});
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_fwd(logits, {0, 1}), "labels has 2 entries; expected T=3");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_fwd(logits, {0, 1, 2, 3}), "labels has 4 entries; expected T=3");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_fwd(logits, {0, 5, 1}),
                                   "labels[1]=5 is outside the vocabulary [0, 5)");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_fwd(logits, {0, 1, -1}),
                                   "labels[2]=-1 is outside the vocabulary [0, 5) and is not ignore_index=-100");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_fwd(Tensor({3, 5, 1}), {0, 1, 2}),
                                   "logits must have 2 dimensions; got shape [3, 5, 1]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_fwd(Tensor({15}), {0, 1, 2}), "logits must have 2 dimensions");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_fwd(Tensor(), {}), "logits is required");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_fwd(Tensor({1, 0}), {0}),
                                   "labels[0]=0 is outside the vocabulary [0, 0)");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_bwd(1.0, logits, {0, 1}), "cross_entropy_bwd: labels has 2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_bwd(1.0, logits, {0, 1, 7}), "labels[2]=7 is outside");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(ref::cross_entropy_bwd(1.0, Tensor({2, 3, 5}), {0, 1}),
                                   "cross_entropy_bwd: logits must have 2 dimensions");
}

}  // namespace
}  // namespace fusepack::test
