// The packer: batches never split an example, respect the token budget, cover every example exactly once per epoch,
// depend only on the seed, stay within the look-ahead of the shuffled order; oversize policies; paired and fill
// modes; batching statistics.
#include "packing/packer.h"

#include "packing/stats.h"
#include "packing/synthetic.h"
#include "tests/support/env.h"
#include "tests/support/expect.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

namespace fusepack::test {
namespace {

using packing::BatchPlan;
using packing::Example;
using packing::kIgnoreIndex;
using packing::OversizePolicy;
using packing::PackerOptions;
using packing::PlanMode;

// Log-normal lengths like a fine-tuning set, scaled down so the smoke level stays fast.
std::vector<std::int64_t> lognormal_lengths(std::int64_t n, std::int64_t budget) {
  packing::SyntheticSpec spec;
  spec.num_examples = n;
  spec.median_length = static_cast<double>(budget) / 9;
  spec.max_length = budget;
  spec.seed = test_seed();
  return packing::synthetic_lengths(spec);
}

std::vector<Example> small_dataset(std::int64_t n, std::int64_t budget) {
  packing::SyntheticSpec spec;
  spec.num_examples = n;
  spec.median_length = static_cast<double>(budget) / 9;
  spec.max_length = budget;
  spec.prompt_fraction = 0.2;
  spec.seed = test_seed();
  return packing::make_synthetic(spec);
}

PackerOptions options_with(std::int64_t budget, std::int64_t lookahead, std::uint64_t seed) {
  PackerOptions o;
  o.token_budget = budget;
  o.lookahead = lookahead;
  o.seed = seed;
  return o;
}

std::int64_t batch_tokens(std::vector<std::int64_t> const& lengths, BatchPlan const& batch) {
  std::int64_t sum = 0;
  for (std::int64_t id : batch) sum += lengths[static_cast<std::size_t>(id)];
  return sum;
}

// Every index 0..n-1 exactly once over all batches.
void expect_covers_each_example_once(std::vector<BatchPlan> const& batches, std::size_t n) {
  std::vector<int> seen(n, 0);
  for (BatchPlan const& batch : batches) {
    EXPECT_FALSE(batch.empty()) << "empty batch";
    for (std::int64_t id : batch) {
      ASSERT_TRUE(id >= 0 && id < static_cast<std::int64_t>(n)) << "id " << id;
      ++seen[static_cast<std::size_t>(id)];
    }
  }
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "example " << i << " placed " << seen[i] << " times";
}

TEST(Packer, NeverSplitsAnExample) {
  std::int64_t const budget = 512;
  std::vector<Example> const dataset = small_dataset(cases(300, 3000), budget);
  PackerOptions const options = options_with(budget, 16, test_seed());
  for (BatchPlan const& plan : packing::plan_packed(packing::example_lengths(dataset), options)) {
    packing::PackedBatch const b = packing::packed_batch(dataset, plan, options);
    ASSERT_NO_THROW(b.validate());
    ASSERT_EQ(b.example_ids, plan);
    for (std::size_t i = 0; i < plan.size(); ++i) {
      Example const& ex = dataset[static_cast<std::size_t>(plan[i])];
      std::vector<std::int32_t> const tokens(b.tokens.begin() + b.cu_seqlens[i],
                                             b.tokens.begin() + b.cu_seqlens[i + 1]);
      std::vector<std::int32_t> const labels(b.labels.begin() + b.cu_seqlens[i],
                                             b.labels.begin() + b.cu_seqlens[i + 1]);
      EXPECT_EQ(tokens, ex.input_ids) << "example " << plan[i] << " is not whole in its batch";
      EXPECT_EQ(labels, packing::shifted_labels(ex)) << "example " << plan[i];
    }
  }
}

TEST(Packer, RespectsTheTokenBudget) {
  auto const lengths = lognormal_lengths(cases(3000, 30000), 2048);
  for (std::int64_t lookahead : {1, 8, 64}) {
    PackerOptions const options = options_with(2048, lookahead, test_seed());
    for (BatchPlan const& batch : packing::plan_packed(lengths, options)) {
      EXPECT_LE(batch_tokens(lengths, batch), options.token_budget);
    }
    for (BatchPlan const& batch : packing::plan_padded(lengths, options)) {
      std::int64_t longest = 0;
      for (std::int64_t id : batch) longest = std::max(longest, lengths[static_cast<std::size_t>(id)]);
      EXPECT_LE(static_cast<std::int64_t>(batch.size()) * longest, options.token_budget);
    }
  }
}

TEST(Packer, CoversEveryExampleExactlyOncePerEpoch) {
  auto const lengths = lognormal_lengths(cases(2000, 20000), 1024);
  PackerOptions const options = options_with(1024, 64, test_seed());
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    for (PlanMode mode : {PlanMode::kPaired, PlanMode::kFill}) {
      packing::EpochPlan const plan = packing::plan_epoch(lengths, options, mode, epoch);
      expect_covers_each_example_once(plan.packed, lengths.size());
      expect_covers_each_example_once(plan.padded, lengths.size());
    }
  }
}

TEST(Packer, SameSeedGivesTheSameBatches) {
  auto const lengths = lognormal_lengths(2000, 2048);
  PackerOptions const options = options_with(2048, 64, test_seed());
  EXPECT_EQ(packing::plan_packed(lengths, options, 3), packing::plan_packed(lengths, options, 3));
  EXPECT_EQ(packing::plan_padded(lengths, options, 3), packing::plan_padded(lengths, options, 3));
}

TEST(Packer, SameSeedGivesTheSameBatchesOnEveryPlatform) {
  // Pins the shuffle: SplitMix64 + Fisher-Yates are spelled out in packing/rng.h (std::shuffle is not portable).
  EXPECT_EQ(packing::shuffled_order(8, 1, 0), (std::vector<std::int64_t>{4, 3, 5, 1, 0, 2, 7, 6}));
}

TEST(Packer, DifferentSeedsAndEpochsGiveDifferentBatches) {
  auto const lengths = lognormal_lengths(2000, 2048);
  PackerOptions a = options_with(2048, 64, test_seed());
  PackerOptions b = a;
  b.seed += 1;
  EXPECT_NE(packing::plan_packed(lengths, a), packing::plan_packed(lengths, b));
  EXPECT_NE(packing::plan_padded(lengths, a), packing::plan_padded(lengths, b));
  EXPECT_NE(packing::plan_packed(lengths, a, 0), packing::plan_packed(lengths, a, 1));
}

TEST(Packer, DefersAnExampleBehindFewerThanLookaheadEarlierOnes) {
  // Bounded look-ahead, not a global sort: when an example is placed, at most lookahead-1 examples that came
  // before it in the shuffled stream are still waiting.
  auto const lengths = lognormal_lengths(cases(1500, 6000), 2048);
  for (std::int64_t lookahead : {1, 4, 64}) {
    PackerOptions const options = options_with(2048, lookahead, test_seed());
    std::vector<std::int64_t> const order =
        packing::shuffled_order(static_cast<std::int64_t>(lengths.size()), options.seed, 0);
    std::vector<std::size_t> position(order.size());
    for (std::size_t k = 0; k < order.size(); ++k) position[static_cast<std::size_t>(order[k])] = k;
    std::vector<bool> placed(order.size(), false);
    std::int64_t worst = 0;
    for (BatchPlan const& batch : packing::plan_packed(lengths, options)) {
      for (std::int64_t id : batch) {
        std::size_t const pos = position[static_cast<std::size_t>(id)];
        std::int64_t waiting = 0;
        for (std::size_t k = 0; k < pos; ++k) waiting += !placed[k];
        worst = std::max(worst, waiting);
        placed[pos] = true;
      }
    }
    EXPECT_LE(worst, lookahead - 1) << "lookahead " << lookahead;
  }
}

TEST(Packer, LookaheadOneKeepsTheShuffledOrder) {
  auto const lengths = lognormal_lengths(500, 2048);
  PackerOptions const options = options_with(2048, 1, test_seed());
  std::vector<std::int64_t> flat;
  for (BatchPlan const& batch : packing::plan_packed(lengths, options))
    flat.insert(flat.end(), batch.begin(), batch.end());
  EXPECT_EQ(flat, packing::shuffled_order(500, options.seed, 0));
}

TEST(Packer, PacksALogNormalSetDenselyAndNeedsFewerBatchesThanPadding) {
  auto const lengths = lognormal_lengths(cases(3000, 30000), 8192);
  PackerOptions const options = options_with(8192, 64, test_seed());
  packing::EpochPlan const plan = packing::plan_epoch(lengths, options, PlanMode::kFill);
  packing::BatchingStats const packed = packing::packed_stats(lengths, plan.packed, options.token_budget);
  packing::BatchingStats const padded = packing::padded_stats(lengths, plan.padded, options.token_budget);
  std::printf("[  packer  ] %lld examples: packed %lld batches (fill %.3f), padded %lld batches (padding %.3f)\n",
              static_cast<long long>(lengths.size()), static_cast<long long>(packed.batches), packed.budget_fill(),
              static_cast<long long>(padded.batches), padded.padding_fraction());
  EXPECT_GT(packed.budget_fill(), 0.95);
  EXPECT_EQ(packed.padding_fraction(), 0.0);
  EXPECT_GT(padded.padding_fraction(), 0.1);
  EXPECT_LT(packed.batches, padded.batches);
  EXPECT_EQ(packed.tokens, padded.tokens);
  EXPECT_EQ(packed.examples, static_cast<std::int64_t>(lengths.size()));
}

TEST(Packer, OversizeErrorNamesTheExampleAndItsLength) {
  PackerOptions const options = options_with(100, 8, 1);
  std::vector<std::int64_t> const lengths{10, 50, 101, 3};
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::plan_packed(lengths, options),
                                   "example 2 has 101 tokens, more than the token budget of 100");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::plan_padded(lengths, options), "example 2 has 101 tokens");
  std::vector<Example> const dataset{Example{std::vector<std::int32_t>(101, 1), std::vector<std::int32_t>(101, 1)}};
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::packed_batch(dataset, {0}, options), "example 0 has 101 tokens");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::padded_batch(dataset, {0}, options), "example 0 has 101 tokens");
}

TEST(Packer, OversizeTruncateCutsTheExampleToTheBudget) {
  PackerOptions options = options_with(100, 8, 1);
  options.oversize = OversizePolicy::kTruncate;
  std::vector<Example> dataset;
  for (std::int32_t len : {30, 250, 70, 100, 1}) {
    Example ex;
    for (std::int32_t p = 0; p < len; ++p) {
      ex.input_ids.push_back(p % 50);
      ex.labels.push_back(p % 50);
    }
    dataset.push_back(ex);
  }
  auto const lengths = packing::example_lengths(dataset);
  EXPECT_EQ(packing::budgeted_lengths(lengths, options), (std::vector<std::int64_t>{30, 100, 70, 100, 1}));
  std::vector<BatchPlan> const plan = packing::plan_packed(lengths, options);
  expect_covers_each_example_once(plan, dataset.size());
  for (BatchPlan const& ids : plan) {
    packing::PackedBatch const b = packing::packed_batch(dataset, ids, options);
    ASSERT_NO_THROW(b.validate());
    EXPECT_LE(b.num_tokens(), 100);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] != 1) continue;
      EXPECT_EQ(b.cu_seqlens[i + 1] - b.cu_seqlens[i], 100);
      EXPECT_EQ(b.labels[b.cu_seqlens[i + 1] - 1], kIgnoreIndex) << "the cut example's last token has no target";
      EXPECT_EQ(b.labels[b.cu_seqlens[i + 1] - 2], 99 % 50);
    }
    packing::PaddedBatch const p = packing::padded_batch(dataset, ids, options);
    ASSERT_NO_THROW(p.validate());
    EXPECT_LE(p.cols, 100);
  }
}

TEST(Packer, PairedModeGivesBothPathsTheSameExamplesPerStep) {
  std::vector<Example> const dataset = small_dataset(cases(200, 2000), 512);
  PackerOptions const options = options_with(512, 32, test_seed());
  packing::EpochPlan const plan = packing::plan_epoch(packing::example_lengths(dataset), options, PlanMode::kPaired);
  ASSERT_EQ(plan.packed.size(), plan.padded.size());
  for (std::size_t step = 0; step < plan.packed.size(); ++step) {
    packing::PackedBatch const packed = packing::packed_batch(dataset, plan.packed[step], options);
    packing::PaddedBatch const padded = packing::padded_batch(dataset, plan.padded[step], options);
    ASSERT_NO_THROW(packed.validate());
    ASSERT_NO_THROW(padded.validate());
    EXPECT_EQ(packed.example_ids, padded.example_ids) << "step " << step;
    EXPECT_EQ(packed.num_tokens(), padded.num_tokens()) << "step " << step;
    EXPECT_EQ(packed.num_targets(), padded.num_targets()) << "step " << step << ": the loss denominators differ";
  }
}

TEST(Packer, FillModePlansPaddedBatchesWithinTheBudget) {
  std::vector<Example> const dataset = small_dataset(cases(200, 2000), 512);
  PackerOptions const options = options_with(512, 32, test_seed());
  packing::EpochPlan const plan = packing::plan_epoch(packing::example_lengths(dataset), options, PlanMode::kFill);
  EXPECT_LT(plan.packed.size(), plan.padded.size());
  for (BatchPlan const& ids : plan.padded) {
    packing::PaddedBatch const b = packing::padded_batch(dataset, ids, options);
    ASSERT_NO_THROW(b.validate());
    EXPECT_LE(b.num_slots(), options.token_budget);
  }
}

TEST(Packer, AnEmptyDatasetHasNoBatches) {
  PackerOptions const options;
  EXPECT_TRUE(packing::plan_packed({}, options).empty());
  EXPECT_TRUE(packing::plan_padded({}, options).empty());
}

TEST(Packer, RejectsBadOptionsAndLengths) {
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::plan_packed({5}, options_with(0, 8, 1)),
                                   "token_budget must be in [1, 2^30]");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::plan_packed({5}, options_with(64, 0, 1)), "lookahead must be >= 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::plan_packed({5, 0}, options_with(64, 8, 1)),
                                   "example 1 has 0 tokens; examples must have at least 1 token");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::parse_oversize_policy("drop"), "must be 'error' or 'truncate'; got 'drop'");
  EXPECT_EQ(packing::parse_oversize_policy("truncate"), OversizePolicy::kTruncate);
}

TEST(BatchingStats, CountsPaddingAndTokensPerBatch) {
  std::vector<std::int64_t> const lengths{3, 5, 2, 6};
  std::vector<BatchPlan> const batches{{0, 1}, {2, 3}};
  packing::BatchingStats const packed = packing::packed_stats(lengths, batches, 8);
  EXPECT_EQ(packed.examples, 4);
  EXPECT_EQ(packed.tokens, 16);
  EXPECT_EQ(packed.batches, 2);
  EXPECT_EQ(packed.slots, 16);
  EXPECT_EQ(packed.padding_fraction(), 0.0);
  EXPECT_EQ(packed.budget_fill(), 1.0);
  EXPECT_EQ(packed.min_tokens_per_batch, 8);
  EXPECT_EQ(packed.max_tokens_per_batch, 8);
  EXPECT_EQ(packed.mean_examples_per_batch, 2.0);
  packing::BatchingStats const padded = packing::padded_stats(lengths, {{0, 1, 2}, {3}}, 16);
  EXPECT_EQ(padded.slots, 3 * 5 + 6);
  EXPECT_DOUBLE_EQ(padded.padding_fraction(), 5.0 / 21.0);
  EXPECT_DOUBLE_EQ(padded.budget_fill(), 16.0 / 32.0);
  EXPECT_EQ(padded.min_tokens_per_batch, 6);
  EXPECT_EQ(padded.max_tokens_per_batch, 10);
  EXPECT_DOUBLE_EQ(padded.mean_tokens_per_batch, 8.0);
}

}  // namespace
}  // namespace fusepack::test
