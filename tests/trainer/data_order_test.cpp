// The trainer trains exactly the micro-batches the packer plans for its settings: --lookahead, --pairing and the
// per-epoch reshuffle reach the plan, in the trainer's order, across epoch boundaries. Each test reads which examples
// every micro-batch holds (every example's first token is its own id) and compares them with packing::plan_epoch's
// plans of epochs 0, 1, 2, ... (tested on their own in tests/packing/packer_test.cpp). Each also asserts that the
// plan of the setting a careless trainer would use instead (the default lookahead, the other pairing, epoch 0 again)
// differs from the one checked in the micro-batches it trains, so a trainer that ignored the setting fails the test.
// Planted in the trainer one at a time (every epoch drawn as epoch 0, --lookahead not handed to the packer, --pairing
// not handed to it), each bug fails the tests of the setting it breaks.
#include "packing/packer.h"
#include "tests/golden/e2e_support.h"
#include "tests/support/run_binary.h"
#include "trainer/model/batch.h"
#include "trainer/train/config.h"
#include "trainer/train/run.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using packing::BatchPlan;
using packing::PlanMode;
using train::Batching;
using train::TrainConfig;

constexpr std::int64_t kExamples = 40;

// Example i: 3 + (i·7 mod 23) tokens (3..25, neighbours of different lengths), its first token i + 1, every position
// supervised. Returns the lengths; writes the dataset as JSONL to `path`.
std::vector<std::int64_t> write_dataset(std::string const& path) {
  std::ofstream out(path);
  std::vector<std::int64_t> lengths;
  for (std::int64_t i = 0; i < kExamples; ++i) {
    std::int64_t const n = 3 + (i * 7) % 23;
    lengths.push_back(n);
    out << "{\"input_ids\": [" << i + 1;
    for (std::int64_t k = 1; k < n; ++k) out << ", " << 100 + (i * 13 + k * 5) % 150;
    out << "]}\n";
  }
  return lengths;
}

// The golden's model and optimizer (qwen35-tiny, composite fp64 on the CPU) over the dataset at `path`, with a
// 64-token budget and 2 micro-batches per step: 20 steps cross at least two epoch boundaries.
TrainConfig settings(std::string const& path, Batching batching, PlanMode pairing, std::int64_t lookahead) {
  TrainConfig c = golden_settings("qwen35-tiny", batching, ops::Backend::kComposite, train::DType::kFloat64, "cpu");
  c.data = path;
  c.token_budget = 64;
  c.micro_batches = 2;
  c.steps = 20;
  c.pairing = pairing;
  c.lookahead = lookahead;
  return c;
}

// The examples of every micro-batch the run trains, in order: the first token of each example (or padded row).
std::vector<BatchPlan> trained_micro_batches(TrainConfig const& c) {
  std::vector<BatchPlan> seen;
  train::RunOptions o;
  o.command = "data_order_test";
  o.edit_micro_batch = [&seen](model::ModelBatch& b) {
    at::Tensor const starts = b.cu_seqlens.to(at::kLong).slice(0, 0, b.num_examples);
    at::Tensor const first = b.tokens.index_select(0, starts);
    BatchPlan ids;
    for (std::int64_t r = 0; r < b.num_examples; ++r) ids.push_back(first[r].item<std::int64_t>() - 1);
    seen.push_back(ids);
  };
  train::run_training(c, o);
  return seen;
}

// The first `count` micro-batches of epochs 0, 1, 2, ... as the packer plans them for these settings. With
// `reshuffle` false every epoch repeats epoch 0's plan (the bug of a trainer that never reshuffles).
std::vector<BatchPlan> planned_micro_batches(std::vector<std::int64_t> const& lengths, TrainConfig const& c,
                                             std::size_t count, bool reshuffle = true) {
  packing::PackerOptions o;
  o.token_budget = c.token_budget;
  o.lookahead = c.lookahead;
  o.seed = c.seed;
  o.oversize = c.oversize;
  std::vector<BatchPlan> out;
  for (std::uint64_t epoch = 0; out.size() < count; ++epoch) {
    packing::EpochPlan const plan = packing::plan_epoch(lengths, o, c.pairing, reshuffle ? epoch : 0);
    for (BatchPlan const& b : c.batching == Batching::kPacked ? plan.packed : plan.padded) {
      if (out.size() < count) out.push_back(b);
    }
  }
  return out;
}

// How many micro-batches one epoch of these settings has: the trained sequence must go past it.
std::size_t epoch_size(std::vector<std::int64_t> const& lengths, TrainConfig const& c) {
  packing::PackerOptions o;
  o.token_budget = c.token_budget;
  o.lookahead = c.lookahead;
  o.seed = c.seed;
  packing::EpochPlan const plan = packing::plan_epoch(lengths, o, c.pairing, 0);
  return (c.batching == Batching::kPacked ? plan.packed : plan.padded).size();
}

class DataOrder : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = test_temp_path("data_order", ".jsonl");
    lengths_ = write_dataset(path_);
  }
  std::string path_;
  std::vector<std::int64_t> lengths_;
};

TEST_F(DataOrder, PackedMicroBatchesFollowTheLookaheadOfTheSettingsAcrossEpochs) {
  for (std::int64_t lookahead : {1, 3}) {
    TrainConfig const c = settings(path_, Batching::kPacked, PlanMode::kPaired, lookahead);
    std::vector<BatchPlan> const trained = trained_micro_batches(c);
    ASSERT_EQ(trained.size(), static_cast<std::size_t>(c.steps * c.micro_batches));
    ASSERT_GT(trained.size(), 2 * epoch_size(lengths_, c)) << "the run must cross two epoch boundaries";
    std::vector<BatchPlan> const planned = planned_micro_batches(lengths_, c, trained.size());
    EXPECT_EQ(trained, planned) << "lookahead " << lookahead;
    // The plans a trainer would follow if it dropped --lookahead (the packer's default) or never reshuffled.
    TrainConfig defaulted = c;
    defaulted.lookahead = packing::PackerOptions{}.lookahead;
    EXPECT_NE(planned, planned_micro_batches(lengths_, defaulted, trained.size())) << "lookahead " << lookahead;
    EXPECT_NE(planned, planned_micro_batches(lengths_, c, trained.size(), /*reshuffle=*/false));
  }
}

TEST_F(DataOrder, PaddedMicroBatchesFollowThePairingOfTheSettingsAcrossEpochs) {
  for (PlanMode pairing : {PlanMode::kPaired, PlanMode::kFill}) {
    TrainConfig const c = settings(path_, Batching::kPadded, pairing, 4);
    std::vector<BatchPlan> const trained = trained_micro_batches(c);
    ASSERT_GT(trained.size(), 2 * epoch_size(lengths_, c)) << "the run must cross two epoch boundaries";
    std::vector<BatchPlan> const planned = planned_micro_batches(lengths_, c, trained.size());
    EXPECT_EQ(trained, planned) << "pairing " << (pairing == PlanMode::kFill ? "fill" : "paired");
    TrainConfig other = c;
    other.pairing = pairing == PlanMode::kFill ? PlanMode::kPaired : PlanMode::kFill;
    EXPECT_NE(planned, planned_micro_batches(lengths_, other, trained.size()));
    EXPECT_NE(planned, planned_micro_batches(lengths_, c, trained.size(), /*reshuffle=*/false));
  }
}

// Paired, the padded run trains the packed run's examples step by step (what makes their losses comparable).
TEST_F(DataOrder, PairedPaddedMicroBatchesHoldThePackedOnesExamples) {
  std::vector<BatchPlan> const packed = trained_micro_batches(settings(path_, Batching::kPacked, PlanMode::kPaired, 4));
  std::vector<BatchPlan> const padded = trained_micro_batches(settings(path_, Batching::kPadded, PlanMode::kPaired, 4));
  EXPECT_EQ(packed, padded);
}

}  // namespace
}  // namespace fusepack::test
