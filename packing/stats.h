// What a batching costs: batches, padding and tokens per batch, for the packed path and the padded baseline of the
// same examples (fusepack-pack prints these side by side).
#pragma once

#include "packing/packer.h"

#include <cstdint>
#include <vector>

namespace fusepack::packing {

struct BatchingStats {
  std::int64_t examples = 0;
  std::int64_t tokens = 0;  // real tokens over all batches
  std::int64_t batches = 0;
  std::int64_t slots = 0;  // token slots the batches occupy: packed T = tokens; padded rows x longest
  std::int64_t token_budget = 0;
  std::int64_t min_tokens_per_batch = 0;
  std::int64_t max_tokens_per_batch = 0;
  double mean_tokens_per_batch = 0;
  double mean_examples_per_batch = 0;

  double padding_fraction() const;  // (slots - tokens) / slots: the share of computed slots that are padding
  double budget_fill() const;       // tokens / (batches x token_budget): how full batches are against the budget
};

// `lengths` as the batches will see them (budgeted_lengths()), `batches` a plan over them.
BatchingStats packed_stats(std::vector<std::int64_t> const& lengths, std::vector<BatchPlan> const& batches,
                           std::int64_t token_budget);
BatchingStats padded_stats(std::vector<std::int64_t> const& lengths, std::vector<BatchPlan> const& batches,
                           std::int64_t token_budget);

}  // namespace fusepack::packing
