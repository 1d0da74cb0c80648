// Epoch plans: which examples go into which batch, for the packed path and the padded baseline
// (docs/contracts.md, batches). An epoch is a seeded shuffle of the example indices; packed batches are filled from that
// stream by bounded look-ahead first-fit (the open batch takes the first of the next `lookahead` waiting examples that
// fits), so an example is never split, never dropped, and never waits behind more than lookahead-1 earlier examples.
// The dataset is never sorted by length: sorting correlates neighbouring samples and biases training.
// Plans work on example lengths only, so a large dataset can be planned without holding its tokens.
#pragma once

#include "packing/batch.h"
#include "packing/example.h"
#include "packing/progress.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::packing {

enum class OversizePolicy {
  kError,     // an example longer than the token budget is an error naming it
  kTruncate,  // an example longer than the token budget is cut to the budget (its new last token gets -100)
};

enum class PlanMode {
  kPaired,  // the padded path gets exactly the examples of each packed batch (step-by-step loss comparisons); a
            // padded batch is then rows x longest, which may exceed the token budget
  kFill,    // packed batches as dense as possible; padded batches planned separately, rows x longest <= budget
};

struct PackerOptions {
  std::int64_t token_budget = 8192;  // most tokens in a packed batch; most rows x longest in a planned padded batch
  std::int64_t lookahead = 64;       // examples the packer may look past the oldest waiting one, >= 1 (1 = in order)
  std::uint64_t seed = 0;            // of the shuffle; the epoch is mixed in
  OversizePolicy oversize = OversizePolicy::kError;
  // packed_batch completes every packed batch to token_budget tokens with a filler example (complete_to_budget)
  bool complete_packs = false;
  std::int32_t filler_token = 0;

  void validate() const;  // throws std::invalid_argument
};

// Dataset indices of one batch, in batch order.
using BatchPlan = std::vector<std::int64_t>;

struct EpochPlan {
  PlanMode mode = PlanMode::kPaired;
  std::vector<BatchPlan> packed;  // one per optimizer step of the packed path
  std::vector<BatchPlan> padded;  // kPaired: equal to `packed`; kFill: the padded plan
};

std::vector<std::int64_t> example_lengths(std::vector<Example> const& dataset);

// The lengths the batches will have under options.oversize: kError throws std::invalid_argument naming the first
// example longer than the budget ("example 17 has 9000 tokens, more than the token budget of 8192"); kTruncate
// clips them to the budget. Zero lengths are rejected (empty examples never reach the packer).
std::vector<std::int64_t> budgeted_lengths(std::vector<std::int64_t> const& lengths, PackerOptions const& options);

// 0..n-1 in the seeded order of the given epoch.
std::vector<std::int64_t> shuffled_order(std::int64_t n, std::uint64_t seed, std::uint64_t epoch);

// Packed batches of at most token_budget tokens (see the file comment). With `progress`, planning a large dataset
// reports itself every interval ("planning epoch 0 (packed): 4,123,456 of 10,000,000 examples placed (41.2%), ...").
std::vector<BatchPlan> plan_packed(std::vector<std::int64_t> const& lengths, PackerOptions const& options,
                                   std::uint64_t epoch = 0, Progress const* progress = nullptr);
// Padded batches over the same shuffled order, filled in order while rows x longest <= token_budget.
std::vector<BatchPlan> plan_padded(std::vector<std::int64_t> const& lengths, PackerOptions const& options,
                                   std::uint64_t epoch = 0, Progress const* progress = nullptr);
EpochPlan plan_epoch(std::vector<std::int64_t> const& lengths, PackerOptions const& options, PlanMode mode,
                     std::uint64_t epoch = 0, Progress const* progress = nullptr);

// The batch of one plan entry, with examples cut to the budget under kTruncate (and rejected under kError).
PackedBatch packed_batch(std::vector<Example> const& dataset, BatchPlan const& plan, PackerOptions const& options);
PaddedBatch padded_batch(std::vector<Example> const& dataset, BatchPlan const& plan, PackerOptions const& options);

char const* oversize_policy_name(OversizePolicy policy);        // "error", "truncate"
OversizePolicy parse_oversize_policy(std::string const& name);  // throws std::invalid_argument

}  // namespace fusepack::packing
