#include "properties/gen/datasets.h"

#include <algorithm>
#include <ostream>
#include <tuple>
#include <utility>

namespace fusepack::packing {

void showValue(Example const& example, std::ostream& os) {
  // One entry per token: the id, with a '*' when the position is supervised (labels[p] == input_ids[p]).
  os << "{";
  for (std::size_t p = 0; p < example.input_ids.size(); ++p) {
    os << (p ? " " : "") << example.input_ids[p] << (example.labels[p] != kIgnoreIndex ? "*" : "");
  }
  os << "}";
}

void showValue(PackerOptions const& options, std::ostream& os) {
  os << "PackerOptions{token_budget=" << options.token_budget << ", lookahead=" << options.lookahead
     << ", seed=" << options.seed << ", oversize=" << oversize_policy_name(options.oversize) << "}";
}

void showValue(PlanMode mode, std::ostream& os) { os << (mode == PlanMode::kPaired ? "paired" : "fill"); }

}  // namespace fusepack::packing

namespace fusepack::props {

void showValue(Epoch epoch, std::ostream& os) { os << "epoch " << epoch.value; }

}  // namespace fusepack::props

namespace fusepack::props::gen {

rc::Gen<packing::Example> example(DatasetLimits limits) {
  // A non-empty container of (token, unsupervised) pairs: shrinking drops positions, moves tokens toward 0 and
  // makes positions supervised.
  return rc::gen::withSize([limits](int size) {
    int const max_len = std::max(1, limits.max_length * std::clamp(size, 0, 100) / 100);
    auto const token = rc::gen::resize(100, rc::gen::inRange<std::int32_t>(0, limits.vocab_size));
    return rc::gen::map(
        rc::gen::resize(max_len, rc::gen::nonEmpty(rc::gen::container<std::vector<std::pair<std::int32_t, bool>>>(
                                     rc::gen::pair(token, rc::gen::arbitrary<bool>())))),
        [](std::vector<std::pair<std::int32_t, bool>> const& positions) {
          packing::Example ex;
          for (auto const& [id, unsupervised] : positions) {
            ex.input_ids.push_back(id);
            ex.labels.push_back(unsupervised ? packing::kIgnoreIndex : id);
          }
          return ex;
        });
  });
}

rc::Gen<std::vector<packing::Example>> dataset(DatasetLimits limits) {
  return rc::gen::withSize([limits](int size) {
    // At least two examples may be drawn from the first case on: batching needs a neighbour.
    int const max_n = std::min(std::max(limits.max_examples, 1),
                               2 + (limits.max_examples - 2) * std::clamp(size, 0, 100) / 100);
    // The examples keep the run's size (their own lengths scale with it); only the count is capped.
    return rc::gen::resize(max_n, rc::gen::nonEmpty(rc::gen::container<std::vector<packing::Example>>(
                                      rc::gen::resize(size, example(limits)))));
  });
}

rc::Gen<packing::PackerOptions> packer_options(std::int64_t longest, std::int64_t max_budget) {
  return rc::gen::mapcat(
      rc::gen::element(packing::OversizePolicy::kError, packing::OversizePolicy::kTruncate),
      [longest, max_budget](packing::OversizePolicy oversize) {
        std::int64_t const lo = oversize == packing::OversizePolicy::kError ? std::max<std::int64_t>(longest, 1) : 1;
        std::int64_t const hi = std::max(lo, max_budget);
        return rc::gen::map(
            rc::gen::tuple(rc::gen::resize(100, rc::gen::inRange<std::int64_t>(lo, hi + 1)),
                           rc::gen::element<std::int64_t>(1, 2, 3, 64),
                           rc::gen::arbitrary<std::uint64_t>(),  // shrinks toward 0: any order is an order
                           rc::gen::arbitrary<bool>()),
            [oversize](std::tuple<std::int64_t, std::int64_t, std::uint64_t, bool> const& t) {
              packing::PackerOptions options;
              options.token_budget = std::get<0>(t);
              options.lookahead = std::get<1>(t);
              options.seed = std::get<2>(t);
              options.oversize = oversize;
              options.complete_packs = std::get<3>(t);  // packed batches completed to the budget by a filler
              return options;
            });
      });
}

rc::Gen<Epoch> epoch() {
  return rc::gen::map(rc::gen::resize(100, rc::gen::inRange<std::uint64_t>(0, 3)),
                      [](std::uint64_t v) { return Epoch{v}; });
}

rc::Gen<packing::PlanMode> plan_mode() { return rc::gen::element(packing::PlanMode::kPaired, packing::PlanMode::kFill); }

}  // namespace fusepack::props::gen
