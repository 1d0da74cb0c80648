// PackedBatch and PaddedBatch: the docs/contracts.md, batches layout on a worked case, the per-example label shift (no
// target ever crosses an example boundary), the invariants validate() enforces, and that both layouts of the same
// examples carry the same targets.
#include "packing/batch.h"

#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "verify/random.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using packing::Example;
using packing::kIgnoreIndex;
using packing::PackedBatch;
using packing::PaddedBatch;
using Ids = std::vector<std::int32_t>;

constexpr std::int32_t X = kIgnoreIndex;

// Examples of random lengths (1 included), random tokens in [0, 1000) and a random unsupervised prefix.
std::vector<Example> random_examples(std::mt19937_64& rng, int count, int max_len) {
  std::vector<Example> out;
  for (int len : random_lengths(rng, count, 1, max_len)) {
    Example ex;
    int const prompt = uniform_int(rng, 0, len);
    for (int p = 0; p < len; ++p) {
      ex.input_ids.push_back(uniform_int(rng, 0, 999));
      ex.labels.push_back(p < prompt ? X : ex.input_ids.back());
    }
    out.push_back(ex);
  }
  return out;
}

// Three examples, the middle one of length 1, the last with a one-token prompt.
std::vector<Example> worked_examples() {
  return {Example{{10, 11, 12}, {10, 11, 12}}, Example{{20}, {20}}, Example{{30, 31, 32, 33}, {X, 31, 32, 33}}};
}

TEST(PackedBatch, LaysOutTheWorkedCaseAsDesignSection3Says) {
  PackedBatch const b = packing::make_packed_batch(worked_examples());
  EXPECT_EQ(b.tokens, (Ids{10, 11, 12, 20, 30, 31, 32, 33}));
  EXPECT_EQ(b.labels, (Ids{11, 12, X, X, 31, 32, 33, X}));
  EXPECT_EQ(b.position_ids, (Ids{0, 1, 2, 0, 0, 1, 2, 3}));
  EXPECT_EQ(b.cu_seqlens, (Ids{0, 3, 4, 8}));
  EXPECT_EQ(b.seq_idx, (Ids{0, 0, 0, 1, 2, 2, 2, 2}));
  EXPECT_EQ(b.max_seqlen, 4);
  EXPECT_EQ(b.example_ids, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(b.num_targets(), 5);
  EXPECT_NO_THROW(b.validate());
}

TEST(PaddedBatch, LaysOutTheWorkedCaseAsDesignSection3Says) {
  PaddedBatch const b = packing::make_padded_batch(worked_examples());
  EXPECT_EQ(b.rows, 3);
  EXPECT_EQ(b.cols, 4);
  EXPECT_EQ(b.tokens, (Ids{10, 11, 12, 0, /**/ 20, 0, 0, 0, /**/ 30, 31, 32, 33}));
  EXPECT_EQ(b.attention_mask, (Ids{1, 1, 1, 0, /**/ 1, 0, 0, 0, /**/ 1, 1, 1, 1}));
  EXPECT_EQ(b.labels, (Ids{11, 12, X, X, /**/ X, X, X, X, /**/ 31, 32, 33, X}));
  EXPECT_EQ(b.position_ids, (Ids{0, 1, 2, 0, /**/ 0, 0, 0, 0, /**/ 0, 1, 2, 3}));
  EXPECT_EQ(b.num_slots(), 12);
  EXPECT_EQ(b.num_tokens(), 8);
  EXPECT_EQ(b.num_targets(), 5);
  EXPECT_EQ(b.row_length(1), 1);
  EXPECT_NO_THROW(b.validate());
}

TEST(PackedBatch, ShiftsLabelsPerExampleSoNoTargetCrossesABoundary) {
  auto rng = test_rng();
  for (int c = 0; c < cases(50, 500); ++c) {
    std::vector<Example> const examples = random_examples(rng, uniform_int(rng, 1, 12), 40);
    PackedBatch const b = packing::make_packed_batch(examples);
    ASSERT_NO_THROW(b.validate());
    for (std::size_t i = 0; i < examples.size(); ++i) {
      std::int32_t const begin = b.cu_seqlens[i], end = b.cu_seqlens[i + 1];
      ASSERT_EQ(end - begin, static_cast<std::int32_t>(examples[i].input_ids.size()));
      EXPECT_EQ(b.labels[end - 1], X) << "last token of example " << i;
      for (std::int32_t t = begin; t < end; ++t) {
        std::int32_t const p = t - begin;
        EXPECT_EQ(b.tokens[t], examples[i].input_ids[p]);
        // The HF shift done per example: the target of position p is the example's own label p+1.
        std::int32_t const expected = p + 1 < end - begin ? examples[i].labels[p + 1] : X;
        EXPECT_EQ(b.labels[t], expected) << "example " << i << " position " << p;
        if (b.labels[t] != X) {
          EXPECT_EQ(b.seq_idx[t + 1], b.seq_idx[t]) << "target of t=" << t << " crosses a boundary";
        }
      }
    }
  }
}

TEST(PackedBatch, ShiftingThePackAsAWholeWouldBeCaught) {
  // torchtune PR #2613: shifting the concatenated pack instead of each example gives every boundary a target from
  // the next example. validate() must reject that layout.
  PackedBatch b = packing::make_packed_batch(worked_examples());
  for (std::size_t t = 0; t + 1 < b.tokens.size(); ++t) b.labels[t] = b.tokens[t + 1];
  b.labels.back() = X;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(b.validate(),
                                   "PackedBatch invariant 'labels are -100 at the last token of every example");
}

TEST(PackedAndPaddedBatches, OfTheSameExamplesCarryTheSameTargets) {
  auto rng = test_rng();
  for (int c = 0; c < cases(50, 500); ++c) {
    std::vector<Example> const examples = random_examples(rng, uniform_int(rng, 1, 10), 30);
    PackedBatch const packed = packing::make_packed_batch(examples);
    PaddedBatch const padded = packing::make_padded_batch(examples);
    ASSERT_NO_THROW(padded.validate());
    EXPECT_EQ(packed.num_targets(), padded.num_targets());
    EXPECT_EQ(packed.num_tokens(), padded.num_tokens());
    EXPECT_EQ(packed.example_ids, padded.example_ids);
    for (std::int64_t r = 0; r < padded.rows; ++r) {
      for (std::int32_t t = packed.cu_seqlens[r]; t < packed.cu_seqlens[r + 1]; ++t) {
        std::int64_t const k = r * padded.cols + (t - packed.cu_seqlens[r]);
        EXPECT_EQ(padded.tokens[k], packed.tokens[t]);
        EXPECT_EQ(padded.labels[k], packed.labels[t]);
        EXPECT_EQ(padded.position_ids[k], packed.position_ids[t]);
      }
    }
  }
}

TEST(PackedBatch, BuildsFromDatasetIndicesInTheGivenOrderAndTruncates) {
  std::vector<Example> const dataset = worked_examples();
  PackedBatch const b = packing::make_packed_batch(dataset, {2, 0}, 3);
  EXPECT_EQ(b.example_ids, (std::vector<std::int64_t>{2, 0}));
  EXPECT_EQ(b.tokens, (Ids{30, 31, 32, 10, 11, 12}));
  EXPECT_EQ(b.labels, (Ids{31, 32, X, 11, 12, X}));  // the cut example's new last token has no target
  EXPECT_EQ(b.cu_seqlens, (Ids{0, 3, 6}));
  EXPECT_NO_THROW(b.validate());
  PaddedBatch const p = packing::make_padded_batch(dataset, {2, 1}, 2, 7);
  EXPECT_EQ(p.tokens, (Ids{30, 31, 20, 7}));
  EXPECT_EQ(p.labels, (Ids{31, X, X, X}));
  EXPECT_NO_THROW(p.validate());
  EXPECT_EQ(packing::shifted_labels(dataset[2]), (Ids{31, 32, 33, X}));
  EXPECT_EQ(packing::shifted_labels(dataset[2], 2), (Ids{31, X}));
}

TEST(PackedBatch, BuildersRejectBadExamples) {
  std::vector<Example> const dataset{Example{{1, 2}, {1, 2}}, Example{}, Example{{1, 2}, {1}}, Example{{1, 2}, {1, 5}}};
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::make_packed_batch(dataset, {}), "needs at least 1 example");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::make_packed_batch(dataset, {0, 4}),
                                   "example id 4 is outside the dataset of 4 examples");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::make_packed_batch(dataset, {1}), "example 1 is empty");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::make_padded_batch(dataset, {2}), "example 2 has 1 labels for 2 input_ids");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::make_padded_batch(dataset, {3}),
                                   "labels[1]=5, neither -100 nor input_ids[1]=2");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::make_padded_batch(dataset, {0}, 0), "max_length must be >= 1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::make_padded_batch(dataset, {0}, -1, -3), "pad_token_id must be >= 0");
}

struct Corruption {
  char const* what;
  std::function<void(PackedBatch&)> apply;
  char const* invariant;
};

TEST(PackedBatch, ValidateNamesEachViolatedInvariant) {
  std::vector<Corruption> const corruptions{
      {"no examples", [](PackedBatch& b) { b.cu_seqlens = {0}; }, "at least one example"},
      {"short labels", [](PackedBatch& b) { b.labels.pop_back(); }, "all have T entries"},
      {"lost example id", [](PackedBatch& b) { b.example_ids.pop_back(); }, "example_ids has N entries"},
      {"cu starts at 1", [](PackedBatch& b) { b.cu_seqlens[0] = 1; }, "cu_seqlens[0] == 0"},
      {"empty example", [](PackedBatch& b) { b.cu_seqlens[2] = b.cu_seqlens[1]; }, "strictly increasing"},
      {"trailing tokens", [](PackedBatch& b) { b.cu_seqlens[3] -= 1; }, "T == cu_seqlens[N]"},
      {"max_seqlen", [](PackedBatch& b) { b.max_seqlen = 3; }, "max_seqlen is the longest example"},
      {"seq_idx", [](PackedBatch& b) { b.seq_idx[3] = 0; }, "seq_idx[t] is the example holding t"},
      {"positions run on", [](PackedBatch& b) { b.position_ids[3] = 3; }, "position_ids restart at 0"},
      {"negative token", [](PackedBatch& b) { b.tokens[0] = -1; }, "tokens are ids >= 0"},
      {"wrong target", [](PackedBatch& b) { b.labels[0] = 99; }, "labels[t] is -100 or tokens[t+1]"},
      {"cross-boundary target", [](PackedBatch& b) { b.labels[2] = 20; }, "-100 at the last token of every example"},
      {"negative example id", [](PackedBatch& b) { b.example_ids[1] = -2; },
       "dataset indices >= 0, or -1 for a filler"},
      {"filler not last", [](PackedBatch& b) { b.example_ids[0] = packing::kFillerExampleId; },
       "dataset indices >= 0, or -1 for a filler at the end"},
      {"filler with a target",  // the label is the next token, so only the filler rule refuses it
       [](PackedBatch& b) {
         std::int64_t const T = b.num_tokens();
         packing::complete_to_budget(b, T + 3, 5);
         b.labels[static_cast<std::size_t>(T)] = 5;
       },
       "a filler has no targets"},
  };
  for (Corruption const& c : corruptions) {
    SCOPED_TRACE(c.what);
    PackedBatch b = packing::make_packed_batch(worked_examples());
    c.apply(b);
    FUSEPACK_EXPECT_INVALID_ARGUMENT(b.validate(), c.invariant);
  }
}

// A filler completes a pack to its budget as an example of its own with no target; the real examples are untouched.
TEST(PackedBatch, CompletedToTheBudgetByAnIsolatedFillerWithoutTargets) {
  PackedBatch const pack = packing::make_packed_batch(worked_examples());
  std::int64_t const T = pack.num_tokens();
  PackedBatch b = pack;
  packing::complete_to_budget(b, T + 4, 7);
  EXPECT_NO_THROW(b.validate());
  EXPECT_EQ(b.num_tokens(), T + 4);
  EXPECT_EQ(b.filler_tokens(), 4);
  EXPECT_EQ(b.num_example_tokens(), T);
  EXPECT_EQ(b.num_examples(), pack.num_examples());
  EXPECT_EQ(b.num_targets(), pack.num_targets());
  auto const n = static_cast<std::size_t>(T);
  EXPECT_EQ(std::vector<std::int32_t>(b.tokens.begin(), b.tokens.begin() + T), pack.tokens);
  EXPECT_EQ(std::vector<std::int32_t>(b.labels.begin(), b.labels.begin() + T), pack.labels);
  EXPECT_EQ(std::vector<std::int32_t>(b.tokens.begin() + T, b.tokens.end()), std::vector<std::int32_t>(4, 7));
  EXPECT_EQ(std::vector<std::int32_t>(b.labels.begin() + T, b.labels.end()), std::vector<std::int32_t>(4, -100));
  EXPECT_EQ(std::vector<std::int32_t>(b.position_ids.begin() + T, b.position_ids.end()),
            (std::vector<std::int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(std::vector<std::int32_t>(b.seq_idx.begin() + T, b.seq_idx.end()), std::vector<std::int32_t>(4, 3));
  std::vector<std::int32_t> cu = pack.cu_seqlens;
  cu.push_back(static_cast<std::int32_t>(T + 4));
  EXPECT_EQ(b.cu_seqlens, cu);
  EXPECT_EQ(b.example_ids.back(), packing::kFillerExampleId);
  EXPECT_EQ(b.max_seqlen, std::max(pack.max_seqlen, 4));
  EXPECT_EQ(pack.filler_tokens(), 0);
  EXPECT_EQ(n, pack.tokens.size());

  PackedBatch full = pack;  // already at the budget: unchanged
  packing::complete_to_budget(full, T, 7);
  EXPECT_EQ(full.tokens, pack.tokens);
  EXPECT_EQ(full.example_ids, pack.example_ids);

  PackedBatch over = pack;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::complete_to_budget(over, T - 1, 7),
                                   "holds " + std::to_string(T) + " tokens, more than the token budget of " +
                                       std::to_string(T - 1));
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::complete_to_budget(b, T + 8, 7), "ends in a filler already");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::complete_to_budget(over, T + 1, -1), "must be an id >= 0; got -1");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(packing::complete_to_budget(over, std::int64_t(1) << 31, 7),
                                   "a budget of 2147483648 tokens exceeds cu_seqlens' int32 range");
}

TEST(PaddedBatch, ValidateNamesEachViolatedInvariant) {
  struct PaddedCorruption {
    char const* what;
    std::function<void(PaddedBatch&)> apply;
    char const* invariant;
  };
  std::vector<PaddedCorruption> const corruptions{
      {"no rows", [](PaddedBatch& b) { b.rows = 0; }, "at least one row and one column"},
      {"short mask", [](PaddedBatch& b) { b.attention_mask.pop_back(); }, "all have rows*cols entries"},
      {"lost example id", [](PaddedBatch& b) { b.example_ids.pop_back(); }, "example_ids has one entry per row"},
      {"left padding",
       [](PaddedBatch& b) {
         b.attention_mask[4] = 0;
         b.attention_mask[6] = 1;
       },
       "right padding"},
      {"empty row", [](PaddedBatch& b) { b.attention_mask[4] = 0; }, "every row holds at least one real token"},
      {"padding position", [](PaddedBatch& b) { b.position_ids[5] = 1; }, "position_ids are 0..len-1"},
      {"padding token", [](PaddedBatch& b) { b.tokens[5] = 3; }, "padding holds pad_token_id"},
      {"padding label", [](PaddedBatch& b) { b.labels[3] = 0; }, "labels are -100 on padding"},
      {"wrong target", [](PaddedBatch& b) { b.labels[8] = 30; }, "labels[b, p] is -100 or tokens[b, p+1]"},
      {"last real token", [](PaddedBatch& b) { b.labels[2] = 0; }, "-100 at each row's last real token"},
      {"all-padding column",
       [](PaddedBatch& b) {
         for (std::int64_t r = 0; r < b.rows; ++r) {
           std::int64_t const k = r * b.cols + 3;
           b.attention_mask[k] = 0;
           b.tokens[k] = 0;
           b.labels[k] = X;
           b.position_ids[k] = 0;
           b.labels[k - 1] = X;
         }
       },
       "cols is the longest row"},
  };
  for (PaddedCorruption const& c : corruptions) {
    SCOPED_TRACE(c.what);
    PaddedBatch b = packing::make_padded_batch(worked_examples());
    c.apply(b);
    FUSEPACK_EXPECT_INVALID_ARGUMENT(b.validate(), c.invariant);
  }
}

}  // namespace
}  // namespace fusepack::test
