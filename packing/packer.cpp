#include "packing/packer.h"

#include "packing/rng.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace fusepack::packing {
namespace {

constexpr std::uint64_t kShuffleStream = 0x53485546;  // "SHUF"

std::string oversize_message(std::int64_t index, std::int64_t length, std::int64_t budget) {
  return "example " + std::to_string(index) + " has " + std::to_string(length) +
         " tokens, more than the token budget of " + std::to_string(budget) +
         " (raise the budget, or choose the truncate oversize policy to cut such examples to the budget)";
}

// Examples are cut to the budget under kTruncate, rejected under kError.
std::int64_t max_length_for(std::vector<Example> const& dataset, BatchPlan const& plan, PackerOptions const& options) {
  options.validate();
  if (options.oversize == OversizePolicy::kTruncate) return options.token_budget;
  for (std::int64_t id : plan) {
    if (id >= 0 && id < static_cast<std::int64_t>(dataset.size())) {
      auto const len = static_cast<std::int64_t>(dataset[static_cast<std::size_t>(id)].input_ids.size());
      if (len > options.token_budget) throw std::invalid_argument(oversize_message(id, len, options.token_budget));
    }
  }
  return kNoLengthLimit;
}

// The progress of planning one epoch: examples placed of all, batches closed. The clock is read every 4,096
// placements (a placement takes nanoseconds).
class PlanProgress {
 public:
  PlanProgress(Progress const* progress, std::string what, std::size_t examples, std::vector<BatchPlan> const& batches)
      : phase_(progress, std::move(what)), examples_(static_cast<std::int64_t>(examples)), batches_(batches) {}

  void placed_one() {
    if ((++placed_ & 4095) != 0) return;
    phase_.update([this](double) {
      char share[32];
      std::snprintf(share, sizeof share, " (%.1f%%), ",
                    100.0 * static_cast<double>(placed_) / static_cast<double>(examples_));
      return grouped(placed_) + " of " + grouped(examples_) + " examples placed" + share +
             grouped(static_cast<std::int64_t>(batches_.size())) + " batches";
    });
  }
  void done() { phase_.done(grouped(static_cast<std::int64_t>(batches_.size())) + " batches"); }

 private:
  ProgressPhase phase_;
  std::int64_t examples_;
  std::int64_t placed_ = 0;
  std::vector<BatchPlan> const& batches_;
};

}  // namespace

void PackerOptions::validate() const {
  if (token_budget < 1 || token_budget > (std::int64_t{1} << 30)) {
    throw std::invalid_argument("PackerOptions: token_budget must be in [1, 2^30]; got " +
                                std::to_string(token_budget));
  }
  if (lookahead < 1) {
    throw std::invalid_argument("PackerOptions: lookahead must be >= 1; got " + std::to_string(lookahead));
  }
  if (filler_token < 0) {
    throw std::invalid_argument("PackerOptions: filler_token must be an id >= 0; got " + std::to_string(filler_token));
  }
}

std::vector<std::int64_t> example_lengths(std::vector<Example> const& dataset) {
  std::vector<std::int64_t> lengths;
  lengths.reserve(dataset.size());
  for (Example const& ex : dataset) lengths.push_back(static_cast<std::int64_t>(ex.input_ids.size()));
  return lengths;
}

std::vector<std::int64_t> budgeted_lengths(std::vector<std::int64_t> const& lengths, PackerOptions const& options) {
  options.validate();
  std::vector<std::int64_t> out(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    std::int64_t const len = lengths[i];
    if (len < 1) {
      throw std::invalid_argument("example " + std::to_string(i) + " has " + std::to_string(len) +
                                  " tokens; examples must have at least 1 token");
    }
    if (len > options.token_budget && options.oversize == OversizePolicy::kError) {
      throw std::invalid_argument(oversize_message(static_cast<std::int64_t>(i), len, options.token_budget));
    }
    out[i] = std::min(len, options.token_budget);
  }
  return out;
}

std::vector<std::int64_t> shuffled_order(std::int64_t n, std::uint64_t seed, std::uint64_t epoch) {
  if (n < 0) throw std::invalid_argument("shuffled_order: n must be >= 0; got " + std::to_string(n));
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  Rng rng(mix_seed({seed, kShuffleStream, epoch}));
  shuffle(order, rng);
  return order;
}

std::vector<BatchPlan> plan_packed(std::vector<std::int64_t> const& lengths, PackerOptions const& options,
                                   std::uint64_t epoch, Progress const* progress) {
  std::vector<std::int64_t> const len = budgeted_lengths(lengths, options);
  std::vector<std::int64_t> const order = shuffled_order(static_cast<std::int64_t>(len.size()), options.seed, epoch);
  auto const lookahead = static_cast<std::size_t>(options.lookahead);
  std::vector<BatchPlan> batches;
  PlanProgress report(progress, "planning epoch " + std::to_string(epoch) + " (packed)", order.size(), batches);
  // The window always holds the oldest `lookahead` examples not yet placed, in stream order.
  std::vector<std::int64_t> window;
  std::size_t next = 0;
  auto refill = [&] {
    while (window.size() < lookahead && next < order.size()) window.push_back(order[next++]);
  };
  refill();
  while (!window.empty()) {
    BatchPlan batch;
    std::int64_t used = 0;
    // One pass suffices: `used` only grows, so an example skipped once never fits later in this batch. The oldest
    // example always fits an empty batch (lengths are within the budget), so every batch is non-empty.
    for (std::size_t i = 0; i < window.size() && used < options.token_budget;) {
      std::int64_t const id = window[i];
      if (used + len[static_cast<std::size_t>(id)] <= options.token_budget) {
        batch.push_back(id);
        used += len[static_cast<std::size_t>(id)];
        window.erase(window.begin() + static_cast<std::ptrdiff_t>(i));
        refill();
        report.placed_one();
      } else {
        ++i;
      }
    }
    batches.push_back(std::move(batch));
  }
  report.done();
  return batches;
}

std::vector<BatchPlan> plan_padded(std::vector<std::int64_t> const& lengths, PackerOptions const& options,
                                   std::uint64_t epoch, Progress const* progress) {
  std::vector<std::int64_t> const len = budgeted_lengths(lengths, options);
  std::vector<std::int64_t> const order = shuffled_order(static_cast<std::int64_t>(len.size()), options.seed, epoch);
  std::vector<BatchPlan> batches;
  PlanProgress report(progress, "planning epoch " + std::to_string(epoch) + " (padded)", order.size(), batches);
  BatchPlan batch;
  std::int64_t longest = 0;
  for (std::int64_t id : order) {
    std::int64_t const l = std::max(longest, len[static_cast<std::size_t>(id)]);
    if (!batch.empty() && (static_cast<std::int64_t>(batch.size()) + 1) * l > options.token_budget) {
      batches.push_back(std::move(batch));
      batch.clear();
      longest = 0;
    }
    batch.push_back(id);
    longest = std::max(longest, len[static_cast<std::size_t>(id)]);
    report.placed_one();
  }
  if (!batch.empty()) batches.push_back(std::move(batch));
  report.done();
  return batches;
}

EpochPlan plan_epoch(std::vector<std::int64_t> const& lengths, PackerOptions const& options, PlanMode mode,
                     std::uint64_t epoch, Progress const* progress) {
  EpochPlan plan;
  plan.mode = mode;
  plan.packed = plan_packed(lengths, options, epoch, progress);
  plan.padded = mode == PlanMode::kPaired ? plan.packed : plan_padded(lengths, options, epoch, progress);
  return plan;
}

PackedBatch packed_batch(std::vector<Example> const& dataset, BatchPlan const& plan, PackerOptions const& options) {
  PackedBatch b = make_packed_batch(dataset, plan, max_length_for(dataset, plan, options));
  if (options.complete_packs) complete_to_budget(b, options.token_budget, options.filler_token);
  return b;
}

PaddedBatch padded_batch(std::vector<Example> const& dataset, BatchPlan const& plan, PackerOptions const& options) {
  return make_padded_batch(dataset, plan, max_length_for(dataset, plan, options));
}

char const* oversize_policy_name(OversizePolicy policy) {
  return policy == OversizePolicy::kTruncate ? "truncate" : "error";
}

OversizePolicy parse_oversize_policy(std::string const& name) {
  if (name == "error") return OversizePolicy::kError;
  if (name == "truncate") return OversizePolicy::kTruncate;
  throw std::invalid_argument("oversize policy must be 'error' or 'truncate'; got '" + name + "'");
}

}  // namespace fusepack::packing
