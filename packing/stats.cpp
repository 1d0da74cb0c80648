#include "packing/stats.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace fusepack::packing {
namespace {

BatchingStats collect(std::vector<std::int64_t> const& lengths, std::vector<BatchPlan> const& batches,
                      std::int64_t token_budget, bool padded) {
  BatchingStats s;
  s.token_budget = token_budget;
  s.batches = static_cast<std::int64_t>(batches.size());
  s.min_tokens_per_batch = batches.empty() ? 0 : std::numeric_limits<std::int64_t>::max();
  for (BatchPlan const& batch : batches) {
    std::int64_t tokens = 0, longest = 0;
    for (std::int64_t id : batch) {
      if (id < 0 || id >= static_cast<std::int64_t>(lengths.size())) {
        throw std::invalid_argument("batching stats: example id " + std::to_string(id) + " outside " +
                                    std::to_string(lengths.size()) + " lengths");
      }
      std::int64_t const len = lengths[static_cast<std::size_t>(id)];
      tokens += len;
      longest = std::max(longest, len);
    }
    s.examples += static_cast<std::int64_t>(batch.size());
    s.tokens += tokens;
    s.slots += padded ? static_cast<std::int64_t>(batch.size()) * longest : tokens;
    s.min_tokens_per_batch = std::min(s.min_tokens_per_batch, tokens);
    s.max_tokens_per_batch = std::max(s.max_tokens_per_batch, tokens);
  }
  if (s.batches > 0) {
    s.mean_tokens_per_batch = static_cast<double>(s.tokens) / static_cast<double>(s.batches);
    s.mean_examples_per_batch = static_cast<double>(s.examples) / static_cast<double>(s.batches);
  }
  return s;
}

}  // namespace

double BatchingStats::padding_fraction() const {
  return slots == 0 ? 0.0 : static_cast<double>(slots - tokens) / static_cast<double>(slots);
}

double BatchingStats::budget_fill() const {
  return batches == 0
             ? 0.0
             : static_cast<double>(tokens) / (static_cast<double>(batches) * static_cast<double>(token_budget));
}

BatchingStats packed_stats(std::vector<std::int64_t> const& lengths, std::vector<BatchPlan> const& batches,
                           std::int64_t token_budget) {
  return collect(lengths, batches, token_budget, false);
}

BatchingStats padded_stats(std::vector<std::int64_t> const& lengths, std::vector<BatchPlan> const& batches,
                           std::int64_t token_budget) {
  return collect(lengths, batches, token_budget, true);
}

}  // namespace fusepack::packing
