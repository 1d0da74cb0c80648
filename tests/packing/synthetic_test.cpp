// Synthetic datasets: the spec parser and its errors, the log-normal length distribution, the learnable token
// structure, determinism.
#include "packing/synthetic.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <tuple>

namespace fusepack::test {
namespace {

using packing::Example;
using packing::kIgnoreIndex;
using packing::parse_synthetic_spec;
using packing::SyntheticSpec;

TEST(SyntheticSpec, ParsesEveryKey) {
  SyntheticSpec const s =
      parse_synthetic_spec("synthetic:n=10000,median=900,sigma=0.9,vocab=32768,max=8192,seed=1,min=2,prompt=0.25");
  EXPECT_EQ(s.num_examples, 10000);
  EXPECT_EQ(s.median_length, 900);
  EXPECT_EQ(s.sigma, 0.9);
  EXPECT_EQ(s.vocab_size, 32768);
  EXPECT_EQ(s.max_length, 8192);
  EXPECT_EQ(s.min_length, 2);
  EXPECT_EQ(s.prompt_fraction, 0.25);
  EXPECT_EQ(s.seed, 1u);
}

TEST(SyntheticSpec, UnnamedKeysKeepTheBaseValues) {
  SyntheticSpec base;
  base.vocab_size = 64;
  SyntheticSpec const s = parse_synthetic_spec("synthetic:n=3", base);
  EXPECT_EQ(s.num_examples, 3);
  EXPECT_EQ(s.vocab_size, 64);
  EXPECT_EQ(s.median_length, SyntheticSpec{}.median_length);
  EXPECT_EQ(parse_synthetic_spec("synthetic:").num_examples, SyntheticSpec{}.num_examples);
}

TEST(SyntheticSpec, StrParsesBackToTheSameSpec) {
  SyntheticSpec const s =
      parse_synthetic_spec("synthetic:n=7,median=12.5,sigma=0.3,vocab=50,min=3,max=40,prompt=0.1,seed=9");
  SyntheticSpec const back = parse_synthetic_spec(s.str());
  EXPECT_EQ(back.str(), s.str());
  EXPECT_EQ(back.sigma, s.sigma);
  EXPECT_EQ(back.prompt_fraction, s.prompt_fraction);
  EXPECT_EQ(s.str(), "synthetic:n=7,vocab=50,median=12.5,sigma=0.3,min=3,max=40,prompt=0.1,seed=9");
}

TEST(SyntheticSpec, RejectsBadSpecsWithClearMessages) {
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("n=10"), "must start with 'synthetic:'");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:n=10,lenght=5"), "unknown key 'lenght'");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:n=10,n=20"), "key 'n' given twice");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:n"), "'n' is not key=value");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:n=10,,seed=1"), "'' is not key=value");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:n=ten"), "n=ten is not an integer");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:n=1.5"), "n=1.5 is not an integer");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:n="), "n= is not an integer");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:n=0"), "n must be in [1, 100000000]; got 0");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:vocab=0"), "vocab must be in [1, 2^31]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:sigma=-1"), "sigma must be in [0, 10]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:sigma=nan"), "sigma=nan is not a finite number");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:min=0"), "min must be >= 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:min=10,max=5,median=7"), "max must be >= min");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:max=512"), "median must lie in [min, max]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:prompt=1"), "prompt must be in [0, 1)");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:seed=-1"), "seed=-1 is not an unsigned integer");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:n=99999999999999999999"), "is not an integer");
}

TEST(SyntheticSpec, RefusesSizesThatCannotBeHeldInsteadOfThrowingBadAlloc) {
  // n=1e12 asked for 8 TB of lengths: std::bad_alloc leaked to the user.
  FUSEPACK_EXPECT_INVALID_ARGUMENT(parse_synthetic_spec("synthetic:n=1000000000000"),
                                   "n must be in [1, 100000000]; got 1000000000000");
  SyntheticSpec spec;
  spec.num_examples = 2;
  spec.min_length = spec.max_length = std::int64_t{1} << 30;
  spec.median_length = static_cast<double>(spec.max_length);
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::make_synthetic(spec),
                                   "draws 2147483648 tokens; at most 1073741824 (2^30, 8 bytes each in memory)");
}

TEST(Synthetic, LengthsFollowTheSpecMedianAndStayWithinMinAndMax) {
  SyntheticSpec spec;
  spec.num_examples = 10000;
  spec.seed = test_seed();
  for (auto const& [median, sigma, lo, hi] :
       {std::tuple{900.0, 0.9, 1L, 8192L}, std::tuple{64.0, 1.5, 8L, 300L}, std::tuple{20.0, 0.0, 1L, 100L}}) {
    spec.median_length = median;
    spec.sigma = sigma;
    spec.min_length = lo;
    spec.max_length = hi;
    std::vector<std::int64_t> lengths = packing::synthetic_lengths(spec);
    ASSERT_EQ(lengths.size(), 10000u);
    auto const [min_it, max_it] = std::minmax_element(lengths.begin(), lengths.end());
    std::int64_t const shortest = *min_it, longest = *max_it;
    EXPECT_GE(shortest, lo) << spec.str();
    EXPECT_LE(longest, hi) << spec.str();
    std::nth_element(lengths.begin(), lengths.begin() + 5000, lengths.end());
    double const sample_median = static_cast<double>(lengths[5000]);
    std::printf("[  synth   ] %s: sample median %.0f, min %lld, max %lld\n", spec.str().c_str(), sample_median,
                static_cast<long long>(shortest), static_cast<long long>(longest));
    EXPECT_NEAR(sample_median, median, 0.1 * median) << spec.str();
  }
}

TEST(Synthetic, LongTailIsClippedAtMax) {
  SyntheticSpec spec;
  spec.num_examples = 2000;
  spec.median_length = 900;
  spec.sigma = 2.0;
  spec.max_length = 1000;
  spec.seed = test_seed();
  auto const lengths = packing::synthetic_lengths(spec);
  EXPECT_GT(std::count(lengths.begin(), lengths.end(), 1000), 200) << "sigma=2 puts ~48% of lengths above max";
}

TEST(Synthetic, EachExampleIsAProgressionPredictableFromThePreviousTwoTokens) {
  SyntheticSpec spec;
  spec.num_examples = cases(200, 2000);
  spec.vocab_size = 97;
  spec.median_length = 60;
  spec.max_length = 500;
  spec.seed = test_seed();
  std::vector<Example> const examples = packing::make_synthetic(spec);
  ASSERT_EQ(examples.size(), static_cast<std::size_t>(spec.num_examples));
  std::vector<int> steps_seen(8, 0);
  for (Example const& ex : examples) {
    ASSERT_FALSE(ex.input_ids.empty());
    ASSERT_EQ(ex.labels, ex.input_ids);  // prompt=0: every position supervised
    for (std::int32_t id : ex.input_ids) ASSERT_TRUE(id >= 0 && id < spec.vocab_size);
    if (ex.input_ids.size() < 2) continue;
    std::int32_t const step = (ex.input_ids[1] - ex.input_ids[0] + 97) % 97;
    ASSERT_NE(std::find(std::begin(packing::kSyntheticSteps), std::end(packing::kSyntheticSteps), step),
              std::end(packing::kSyntheticSteps));
    ++steps_seen[step];
    for (std::size_t p = 2; p < ex.input_ids.size(); ++p) {
      ASSERT_EQ(ex.input_ids[p], (2 * ex.input_ids[p - 1] - ex.input_ids[p - 2] + 97) % 97) << "position " << p;
    }
  }
  for (std::int32_t step : packing::kSyntheticSteps)
    EXPECT_GT(steps_seen[step], 0) << "step " << step << " never drawn";
}

TEST(Synthetic, PromptFractionLeavesALeadingShareUnsupervised) {
  SyntheticSpec spec = parse_synthetic_spec("synthetic:n=50,median=40,max=200,prompt=0.25");
  for (Example const& ex : packing::make_synthetic(spec)) {
    auto const prompt = static_cast<std::size_t>(0.25 * static_cast<double>(ex.input_ids.size()));
    for (std::size_t p = 0; p < ex.labels.size(); ++p) {
      EXPECT_EQ(ex.labels[p], p < prompt ? kIgnoreIndex : ex.input_ids[p]) << "position " << p;
    }
  }
}

TEST(Synthetic, SameSeedGivesTheSameDatasetAndOtherSeedsDiffer) {
  SyntheticSpec spec = parse_synthetic_spec("synthetic:n=100,median=30,max=100");
  spec.seed = test_seed();
  auto const a = packing::make_synthetic(spec);
  auto const b = packing::make_synthetic(spec);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].input_ids, b[i].input_ids);
  spec.seed += 1;
  auto const c = packing::make_synthetic(spec);
  int same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += a[i].input_ids == c[i].input_ids;
  EXPECT_LT(same, 5);
}

TEST(Synthetic, ExampleIDoesNotDependOnHowManyExamplesAreDrawn) {
  SyntheticSpec spec = parse_synthetic_spec("synthetic:n=30,median=30,max=100");
  auto const small = packing::make_synthetic(spec);
  spec.num_examples = 60;
  auto const large = packing::make_synthetic(spec);
  for (std::size_t i = 0; i < small.size(); ++i) EXPECT_EQ(small[i].input_ids, large[i].input_ids) << "example " << i;
  auto const lengths = packing::synthetic_lengths(spec);
  for (std::size_t i = 0; i < large.size(); ++i)
    EXPECT_EQ(static_cast<std::int64_t>(large[i].input_ids.size()), lengths[i]);
}

}  // namespace
}  // namespace fusepack::test
