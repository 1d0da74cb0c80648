// Packing invariants (docs/contracts.md, batches) on random datasets with random supervision masks and random packer
// options, for the packed path and the padded baseline, and the planted packer bug each must catch:
//   every supervised token once per epoch, in order   a packer that splits an example; one that drops an example
//   the token budget holds                            a packer that closes a batch only once it is over the budget
//   cu_seqlens, seq_idx, position_ids agree           positions not restarting (0..T-1 over the pack)
//   no label crosses an example                       labels shifted once per pack instead of per example
//   same seed -> same batches                         a shuffle seeded from process state
//   paired mode: same examples, same targets          a "paired" plan whose padded side is planned on its own
//   a pack completed to the budget is the pack plus   a filler appended to the last example; a filler with
//   one isolated filler with no targets               targets
// Every property runs with and without packs completed to the budget (PackerOptions::complete_packs); the filler is
// no dataset example, so the checks that follow examples through an epoch skip it and the filler property checks it.
// "Supervised token" means a target: position p >= 1 of an example with labels[p] != -100, within the example's cut
// to the budget under OversizePolicy::kTruncate (the HF shift never makes labels[0] a target).
#include "properties/check.h"
#include "properties/gen/datasets.h"
#include "properties/require.h"
#include "packing/batch.h"
#include "packing/packer.h"
#include "packing/rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace fusepack::props {
namespace {

using packing::BatchPlan;
using packing::Example;
using packing::kIgnoreIndex;
using packing::PackedBatch;
using packing::PackerOptions;
using packing::PaddedBatch;
using packing::PlanMode;

DatasetLimits const kLimits{/*max_examples=*/10, /*max_length=*/12, /*vocab_size=*/50};

struct EpochBatches {
  std::vector<PackedBatch> packed;  // one per optimizer step
  std::vector<PaddedBatch> padded;
};

using Packer = std::function<EpochBatches(std::vector<Example> const& dataset, PackerOptions const& options,
                                          PlanMode mode, std::uint64_t epoch)>;

EpochBatches batches_of(std::vector<Example> const& dataset, PackerOptions const& options,
                        std::vector<BatchPlan> const& packed, std::vector<BatchPlan> const& padded) {
  EpochBatches out;
  for (BatchPlan const& b : packed) out.packed.push_back(packing::packed_batch(dataset, b, options));
  for (BatchPlan const& b : padded) out.padded.push_back(packing::padded_batch(dataset, b, options));
  return out;
}

// The packer under test: packing/'s plan_epoch and batch builders.
EpochBatches fusepack_packer(std::vector<Example> const& dataset, PackerOptions const& options, PlanMode mode,
                             std::uint64_t epoch) {
  packing::EpochPlan const plan = packing::plan_epoch(packing::example_lengths(dataset), options, mode, epoch);
  return batches_of(dataset, options, plan.packed, plan.padded);
}

struct Scenario {
  std::vector<Example> dataset;
  PackerOptions options;
  PlanMode mode;
  std::uint64_t epoch;
};

Scenario draw_scenario(std::optional<PlanMode> mode = std::nullopt) {
  Scenario s;
  s.dataset = *gen::dataset(kLimits);
  std::int64_t longest = 0;
  for (Example const& ex : s.dataset) longest = std::max<std::int64_t>(longest, ex.input_ids.size());
  s.options = *gen::packer_options(longest, 2 * kLimits.max_length);
  s.mode = mode ? *mode : *gen::plan_mode();
  s.epoch = (*gen::epoch()).value;
  std::int64_t tokens = 0;
  for (Example const& ex : s.dataset) tokens += static_cast<std::int64_t>(ex.input_ids.size());
  RC_CLASSIFY(s.dataset.size() == 1, "one example");
  RC_CLASSIFY(tokens > s.options.token_budget, "several batches");
  RC_CLASSIFY(longest > s.options.token_budget, "an example cut to the budget");
  return s;
}

std::int64_t cut_length(Example const& ex, PackerOptions const& options) {
  auto const len = static_cast<std::int64_t>(ex.input_ids.size());
  return options.oversize == packing::OversizePolicy::kTruncate ? std::min(len, options.token_budget) : len;
}

// One example as a batch holds it: a packed slot [cu[i], cu[i+1]) or a padded row's real tokens.
struct Slot {
  std::size_t batch = 0;
  std::size_t index = 0;  // i in the batch
  std::int64_t id = 0;
  std::vector<std::int32_t> tokens, labels;
};

std::vector<Slot> slots_of(std::vector<PackedBatch> const& batches) {
  std::vector<Slot> slots;
  for (std::size_t b = 0; b < batches.size(); ++b) {
    PackedBatch const& pb = batches[b];
    for (std::size_t i = 0; i + 1 < pb.cu_seqlens.size() && i < pb.example_ids.size(); ++i) {
      if (pb.example_ids[i] == packing::kFillerExampleId) continue;  // no dataset example: check_filler's
      auto const begin = static_cast<std::size_t>(pb.cu_seqlens[i]), end = static_cast<std::size_t>(pb.cu_seqlens[i + 1]);
      if (begin > end || end > pb.tokens.size() || end > pb.labels.size()) continue;  // the layout property's job
      slots.push_back({b, i, pb.example_ids[i], {pb.tokens.begin() + begin, pb.tokens.begin() + end},
                       {pb.labels.begin() + begin, pb.labels.begin() + end}});
    }
  }
  return slots;
}

std::vector<Slot> slots_of(std::vector<PaddedBatch> const& batches) {
  std::vector<Slot> slots;
  for (std::size_t b = 0; b < batches.size(); ++b) {
    PaddedBatch const& pb = batches[b];
    for (std::int64_t r = 0; r < pb.rows && r < static_cast<std::int64_t>(pb.example_ids.size()); ++r) {
      auto const begin = static_cast<std::size_t>(r * pb.cols), end = begin + static_cast<std::size_t>(pb.row_length(r));
      slots.push_back({b, static_cast<std::size_t>(r), pb.example_ids[static_cast<std::size_t>(r)],
                       {pb.tokens.begin() + begin, pb.tokens.begin() + end},
                       {pb.labels.begin() + begin, pb.labels.begin() + end}});
    }
  }
  return slots;
}

template <class T>
std::string str(std::vector<T> const& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::vector<std::int32_t> targets(std::vector<std::int32_t> const& labels) {
  std::vector<std::int32_t> out;
  for (std::int32_t l : labels) {
    if (l != kIgnoreIndex) out.push_back(l);
  }
  return out;
}

void check_every_supervised_token_once(Packer const& packer) {
  Scenario const s = draw_scenario();
  EpochBatches const epoch = packer(s.dataset, s.options, s.mode, s.epoch);
  for (bool const packed : {true, false}) {
    char const* const path = packed ? "packed" : "padded";
    std::vector<Slot> const slots = packed ? slots_of(epoch.packed) : slots_of(epoch.padded);
    std::vector<int> seen(s.dataset.size(), 0);
    for (Slot const& slot : slots) {
      FUSEPACK_RC_REQUIRE(slot.id >= 0 && slot.id < static_cast<std::int64_t>(s.dataset.size()),
                          path << " batch " << slot.batch << " holds example id " << slot.id << ", not in the dataset");
      ++seen[static_cast<std::size_t>(slot.id)];
      Example const& ex = s.dataset[static_cast<std::size_t>(slot.id)];
      auto const cut = static_cast<std::size_t>(cut_length(ex, s.options));
      std::vector<std::int32_t> const tokens(ex.input_ids.begin(), ex.input_ids.begin() + cut);
      std::vector<std::int32_t> const supervised = targets({ex.labels.begin() + 1, ex.labels.begin() + cut});
      FUSEPACK_RC_REQUIRE(slot.tokens == tokens, path << " batch " << slot.batch << " holds tokens " << str(slot.tokens)
                                                      << " for example " << slot.id << " whose tokens are "
                                                      << str(tokens));
      FUSEPACK_RC_REQUIRE(targets(slot.labels) == supervised,
                          path << " batch " << slot.batch << " has targets " << str(targets(slot.labels))
                               << " for example " << slot.id << " whose supervised tokens are " << str(supervised));
    }
    for (std::size_t id = 0; id < seen.size(); ++id) {
      FUSEPACK_RC_REQUIRE(seen[id] == 1, path << " path: example " << id << " appears " << seen[id]
                                              << " times in the epoch (once expected)");
    }
  }
}

void check_budget(Packer const& packer) {
  Scenario const s = draw_scenario();
  EpochBatches const epoch = packer(s.dataset, s.options, s.mode, s.epoch);
  for (std::size_t b = 0; b < epoch.packed.size(); ++b) {
    FUSEPACK_RC_REQUIRE(epoch.packed[b].num_tokens() <= s.options.token_budget,
                        "packed batch " << b << " has " << epoch.packed[b].num_tokens() << " tokens, over the budget of "
                                        << s.options.token_budget);
    FUSEPACK_RC_REQUIRE(epoch.packed[b].num_examples() >= 1, "packed batch " << b << " is empty");
  }
  if (s.mode == PlanMode::kFill) {
    for (std::size_t b = 0; b < epoch.padded.size(); ++b) {
      FUSEPACK_RC_REQUIRE(epoch.padded[b].num_slots() <= s.options.token_budget,
                          "padded batch " << b << " is " << epoch.padded[b].rows << " x " << epoch.padded[b].cols
                                          << ", over the budget of " << s.options.token_budget);
    }
  }
}

void check_packed_layout(PackedBatch const& pb, std::size_t b) {
  auto const T = pb.tokens.size();
  FUSEPACK_RC_REQUIRE(pb.labels.size() == T && pb.position_ids.size() == T && pb.seq_idx.size() == T,
                      "packed batch " << b << ": tokens " << T << ", labels " << pb.labels.size() << ", position_ids "
                                      << pb.position_ids.size() << ", seq_idx " << pb.seq_idx.size());
  std::vector<std::int32_t> const& cu = pb.cu_seqlens;
  FUSEPACK_RC_REQUIRE(cu.size() == pb.example_ids.size() + 1 && cu.front() == 0 &&
                          cu.back() == static_cast<std::int32_t>(T),
                      "packed batch " << b << ": cu_seqlens " << str(cu) << " for " << pb.example_ids.size()
                                      << " examples and T=" << T);
  std::int32_t longest = 0;
  for (std::size_t i = 0; i + 1 < cu.size(); ++i) {
    FUSEPACK_RC_REQUIRE(cu[i] < cu[i + 1], "packed batch " << b << ": cu_seqlens " << str(cu)
                                                           << " not strictly increasing");
    longest = std::max(longest, cu[i + 1] - cu[i]);
    for (std::int32_t t = cu[i]; t < cu[i + 1]; ++t) {
      FUSEPACK_RC_REQUIRE(pb.seq_idx[t] == static_cast<std::int32_t>(i),
                          "packed batch " << b << ": seq_idx " << str(pb.seq_idx) << " disagrees with cu_seqlens "
                                          << str(cu) << " at token " << t);
      FUSEPACK_RC_REQUIRE(pb.position_ids[t] == t - cu[i],
                          "packed batch " << b << ": position_ids " << str(pb.position_ids)
                                          << " do not restart at the example starts " << str(cu) << " (token " << t
                                          << ")");
    }
  }
  FUSEPACK_RC_REQUIRE(pb.max_seqlen == longest,
                      "packed batch " << b << ": max_seqlen " << pb.max_seqlen << ", longest example " << longest);
}

void check_padded_layout(PaddedBatch const& pb, std::size_t b) {
  auto const slots = static_cast<std::size_t>(pb.rows * pb.cols);
  FUSEPACK_RC_REQUIRE(pb.tokens.size() == slots && pb.attention_mask.size() == slots && pb.labels.size() == slots &&
                          pb.position_ids.size() == slots && pb.example_ids.size() == static_cast<std::size_t>(pb.rows),
                      "padded batch " << b << ": " << pb.rows << " x " << pb.cols << " with tensors of "
                                      << pb.tokens.size() << " entries");
  std::int64_t longest = 0;
  for (std::int64_t r = 0; r < pb.rows; ++r) {
    std::int64_t const len = pb.row_length(r);
    longest = std::max(longest, len);
    for (std::int64_t c = 0; c < pb.cols; ++c) {
      auto const k = static_cast<std::size_t>(r * pb.cols + c);
      bool const real = c < len;
      FUSEPACK_RC_REQUIRE(pb.attention_mask[k] == (real ? 1 : 0),
                          "padded batch " << b << " row " << r << ": attention_mask is not a prefix of ones");
      FUSEPACK_RC_REQUIRE(pb.position_ids[k] == (real ? c : 0),
                          "padded batch " << b << " row " << r << ": position_ids[" << c << "]=" << pb.position_ids[k]);
      FUSEPACK_RC_REQUIRE(real || pb.tokens[k] == pb.pad_token_id,
                          "padded batch " << b << " row " << r << ": token " << pb.tokens[k] << " on padding");
    }
  }
  FUSEPACK_RC_REQUIRE(pb.cols == longest, "padded batch " << b << ": " << pb.cols << " columns, longest row " << longest);
}

void check_layout(Packer const& packer) {
  Scenario const s = draw_scenario();
  EpochBatches const epoch = packer(s.dataset, s.options, s.mode, s.epoch);
  for (std::size_t b = 0; b < epoch.packed.size(); ++b) check_packed_layout(epoch.packed[b], b);
  for (std::size_t b = 0; b < epoch.padded.size(); ++b) check_padded_layout(epoch.padded[b], b);
}

void check_labels_per_example(Packer const& packer) {
  Scenario const s = draw_scenario();
  EpochBatches const epoch = packer(s.dataset, s.options, s.mode, s.epoch);
  for (bool const packed : {true, false}) {
    char const* const path = packed ? "packed" : "padded";
    for (Slot const& slot : packed ? slots_of(epoch.packed) : slots_of(epoch.padded)) {
      FUSEPACK_RC_REQUIRE(slot.id >= 0 && slot.id < static_cast<std::int64_t>(s.dataset.size()),
                          path << " batch " << slot.batch << " holds example id " << slot.id << ", not in the dataset");
      Example const& ex = s.dataset[static_cast<std::size_t>(slot.id)];
      std::vector<std::int32_t> expected(slot.labels.size(), kIgnoreIndex);  // -100 at the last token
      for (std::size_t p = 0; p + 1 < expected.size(); ++p) expected[p] = ex.labels[p + 1];
      FUSEPACK_RC_REQUIRE(slot.labels == expected, path << " batch " << slot.batch << " example " << slot.index
                                                        << " (id " << slot.id << "): labels " << str(slot.labels)
                                                        << ", its own next-token labels are " << str(expected));
    }
    if (!packed) {
      for (std::size_t b = 0; b < epoch.padded.size(); ++b) {
        PaddedBatch const& pb = epoch.padded[b];
        for (std::size_t k = 0; k < pb.labels.size(); ++k) {
          FUSEPACK_RC_REQUIRE(pb.attention_mask[k] == 1 || pb.labels[k] == kIgnoreIndex,
                              "padded batch " << b << ": label " << pb.labels[k] << " on padding");
        }
      }
    }
  }
}

bool same(PackedBatch const& a, PackedBatch const& b) {
  return a.tokens == b.tokens && a.labels == b.labels && a.position_ids == b.position_ids &&
         a.cu_seqlens == b.cu_seqlens && a.seq_idx == b.seq_idx && a.max_seqlen == b.max_seqlen &&
         a.example_ids == b.example_ids;
}

bool same(PaddedBatch const& a, PaddedBatch const& b) {
  return a.rows == b.rows && a.cols == b.cols && a.tokens == b.tokens && a.attention_mask == b.attention_mask &&
         a.labels == b.labels && a.position_ids == b.position_ids && a.example_ids == b.example_ids &&
         a.pad_token_id == b.pad_token_id;
}

void check_same_seed_same_batches(Packer const& packer) {
  Scenario const s = draw_scenario();
  EpochBatches const first = packer(s.dataset, s.options, s.mode, s.epoch);
  EpochBatches const second = packer(s.dataset, s.options, s.mode, s.epoch);
  FUSEPACK_RC_REQUIRE(first.packed.size() == second.packed.size() && first.padded.size() == second.padded.size(),
                      "two runs with the same seed: " << first.packed.size() << " then " << second.packed.size()
                                                      << " packed batches");
  for (std::size_t b = 0; b < first.packed.size(); ++b) {
    FUSEPACK_RC_REQUIRE(same(first.packed[b], second.packed[b]),
                        "two runs with the same seed: packed batch " << b << " holds examples "
                                                                     << str(first.packed[b].example_ids) << " then "
                                                                     << str(second.packed[b].example_ids));
  }
  for (std::size_t b = 0; b < first.padded.size(); ++b) {
    FUSEPACK_RC_REQUIRE(same(first.padded[b], second.padded[b]),
                        "two runs with the same seed: padded batch " << b << " holds examples "
                                                                     << str(first.padded[b].example_ids) << " then "
                                                                     << str(second.padded[b].example_ids));
  }
}

void check_paired(Packer const& packer) {
  Scenario const s = draw_scenario(PlanMode::kPaired);
  EpochBatches const epoch = packer(s.dataset, s.options, s.mode, s.epoch);
  FUSEPACK_RC_REQUIRE(epoch.packed.size() == epoch.padded.size(),
                      "paired mode: " << epoch.packed.size() << " packed steps, " << epoch.padded.size()
                                      << " padded steps");
  for (std::size_t b = 0; b < epoch.packed.size(); ++b) {
    std::vector<std::int64_t> packed_ids = epoch.packed[b].example_ids;
    if (!packed_ids.empty() && packed_ids.back() == packing::kFillerExampleId) packed_ids.pop_back();
    FUSEPACK_RC_REQUIRE(packed_ids == epoch.padded[b].example_ids,
                        "paired mode, step " << b << ": packed examples " << str(epoch.packed[b].example_ids)
                                             << ", padded examples " << str(epoch.padded[b].example_ids));
  }
  std::vector<Slot> const packed = slots_of(epoch.packed), padded = slots_of(epoch.padded);
  FUSEPACK_RC_REQUIRE(packed.size() == padded.size(), "paired mode: " << packed.size() << " packed examples, "
                                                                      << padded.size() << " padded rows");
  for (std::size_t k = 0; k < packed.size(); ++k) {
    FUSEPACK_RC_REQUIRE(packed[k].tokens == padded[k].tokens && packed[k].labels == padded[k].labels,
                        "paired mode, step " << packed[k].batch << " example " << packed[k].id << ": packed labels "
                                             << str(packed[k].labels) << ", padded labels " << str(padded[k].labels));
  }
}

// Packs completed to the budget: each holds exactly token_budget tokens; its first tokens are the uncompleted pack
// (the same examples, cu_seqlens, tokens, labels, positions and seq_idx); the rest, if any, is one example of its own
// with id kFillerExampleId, positions from 0 and no target.
void check_filler(Packer const& packer) {
  Scenario s = draw_scenario();
  s.options.complete_packs = false;
  EpochBatches const plain = packer(s.dataset, s.options, s.mode, s.epoch);
  s.options.complete_packs = true;
  EpochBatches const full = packer(s.dataset, s.options, s.mode, s.epoch);
  FUSEPACK_RC_REQUIRE(plain.packed.size() == full.packed.size(),
                      full.packed.size() << " completed packs for " << plain.packed.size() << " packs");
  std::int64_t const budget = s.options.token_budget;
  for (std::size_t b = 0; b < full.packed.size(); ++b) {
    PackedBatch const& p = plain.packed[b];
    PackedBatch const& f = full.packed[b];
    FUSEPACK_RC_REQUIRE(f.num_tokens() == budget,
                        "completed pack " << b << " holds " << f.num_tokens() << " tokens, the budget is " << budget);
    auto const T = static_cast<std::size_t>(p.num_tokens());
    auto const prefix = [&](std::vector<std::int32_t> const& v) {
      return std::vector<std::int32_t>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(T, v.size())));
    };
    FUSEPACK_RC_REQUIRE(prefix(f.tokens) == p.tokens && prefix(f.labels) == p.labels &&
                            prefix(f.position_ids) == p.position_ids && prefix(f.seq_idx) == p.seq_idx,
                        "completed pack " << b << " changes the pack's first " << T << " tokens: labels "
                                          << str(f.labels) << " for " << str(p.labels));
    bool const filled = f.num_tokens() > p.num_tokens();
    std::size_t const n = p.example_ids.size() + (filled ? 1 : 0);
    FUSEPACK_RC_REQUIRE(f.example_ids.size() == n && f.cu_seqlens.size() == n + 1 &&
                            std::equal(p.cu_seqlens.begin(), p.cu_seqlens.end(), f.cu_seqlens.begin()) &&
                            std::equal(p.example_ids.begin(), p.example_ids.end(), f.example_ids.begin()),
                        "completed pack " << b << ": cu_seqlens " << str(f.cu_seqlens) << ", examples "
                                          << str(f.example_ids) << " for the pack's " << str(p.cu_seqlens) << ", "
                                          << str(p.example_ids) << " (the filler must be an example of its own)");
    if (!filled) continue;
    FUSEPACK_RC_REQUIRE(f.example_ids.back() == packing::kFillerExampleId,
                        "completed pack " << b << ": the filler's example id is " << f.example_ids.back());
    for (std::size_t t = T; t < f.tokens.size(); ++t) {
      FUSEPACK_RC_REQUIRE(f.labels[t] == kIgnoreIndex && f.position_ids[t] == static_cast<std::int32_t>(t - T) &&
                              f.seq_idx[t] == static_cast<std::int32_t>(n - 1),
                          "completed pack " << b << ", filler token " << t - T << ": label " << f.labels[t]
                                            << ", position " << f.position_ids[t] << ", seq_idx " << f.seq_idx[t]);
    }
    FUSEPACK_RC_REQUIRE(f.num_targets() == p.num_targets(),
                        "completed pack " << b << " has " << f.num_targets() << " targets, the pack "
                                          << p.num_targets());
  }
}

// ---- Planted packers ----

// Fills every batch to exactly the budget, cutting the example that crosses it and carrying the rest over (after the
// oversize policy's own cut, so the only fault is the split).
EpochBatches splitting_packer(std::vector<Example> const& dataset, PackerOptions const& options, PlanMode,
                              std::uint64_t epoch) {
  std::vector<Example> pieces;
  std::vector<std::int64_t> owner;
  std::vector<BatchPlan> plans{{}};
  std::int64_t used = 0;
  for (std::int64_t id : packing::shuffled_order(static_cast<std::int64_t>(dataset.size()), options.seed, epoch)) {
    Example const& ex = dataset[static_cast<std::size_t>(id)];
    auto const cut = static_cast<std::size_t>(cut_length(ex, options));
    std::size_t done = 0;
    while (done < cut) {
      auto const take = std::min<std::size_t>(cut - done, options.token_budget - used);
      Example piece;
      piece.input_ids.assign(ex.input_ids.begin() + done, ex.input_ids.begin() + done + take);
      piece.labels.assign(ex.labels.begin() + done, ex.labels.begin() + done + take);
      plans.back().push_back(static_cast<std::int64_t>(pieces.size()));
      pieces.push_back(piece);
      owner.push_back(id);
      done += take;
      used += take;
      if (used == options.token_budget) {
        plans.emplace_back();
        used = 0;
      }
    }
  }
  if (plans.back().empty()) plans.pop_back();
  EpochBatches out;
  for (BatchPlan const& plan : plans) {
    out.packed.push_back(packing::make_packed_batch(pieces, plan));
    out.padded.push_back(packing::make_padded_batch(pieces, plan));
    for (auto& id : out.packed.back().example_ids) id = owner[static_cast<std::size_t>(id)];
    for (auto& id : out.padded.back().example_ids) id = owner[static_cast<std::size_t>(id)];
  }
  return out;
}

// Closes the open batch when the next example does not fit, and discards that example instead of carrying it over.
EpochBatches dropping_packer(std::vector<Example> const& dataset, PackerOptions const& options, PlanMode,
                             std::uint64_t epoch) {
  std::vector<std::int64_t> const len = packing::budgeted_lengths(packing::example_lengths(dataset), options);
  std::vector<BatchPlan> plans{{}};
  std::int64_t used = 0;
  for (std::int64_t id : packing::shuffled_order(static_cast<std::int64_t>(dataset.size()), options.seed, epoch)) {
    if (used + len[static_cast<std::size_t>(id)] > options.token_budget) {
      plans.emplace_back();
      used = 0;
      continue;
    }
    plans.back().push_back(id);
    used += len[static_cast<std::size_t>(id)];
  }
  plans.erase(std::remove_if(plans.begin(), plans.end(), [](BatchPlan const& p) { return p.empty(); }), plans.end());
  return batches_of(dataset, options, plans, plans);
}

// Adds the next example while the batch is under the budget, so the last one added may overflow it.
EpochBatches overflowing_packer(std::vector<Example> const& dataset, PackerOptions const& options, PlanMode,
                                std::uint64_t epoch) {
  std::vector<std::int64_t> const len = packing::budgeted_lengths(packing::example_lengths(dataset), options);
  std::vector<BatchPlan> plans{{}};
  std::int64_t used = 0;
  for (std::int64_t id : packing::shuffled_order(static_cast<std::int64_t>(dataset.size()), options.seed, epoch)) {
    plans.back().push_back(id);
    used += len[static_cast<std::size_t>(id)];
    if (used >= options.token_budget) {
      plans.emplace_back();
      used = 0;
    }
  }
  if (plans.back().empty()) plans.pop_back();
  return batches_of(dataset, options, plans, plans);
}

EpochBatches positions_not_restarting_packer(std::vector<Example> const& dataset, PackerOptions const& options,
                                             PlanMode mode, std::uint64_t epoch) {
  EpochBatches out = fusepack_packer(dataset, options, mode, epoch);
  for (PackedBatch& pb : out.packed) {
    for (std::size_t t = 0; t < pb.position_ids.size(); ++t) pb.position_ids[t] = static_cast<std::int32_t>(t);
  }
  return out;
}

EpochBatches labels_shifted_per_pack_packer(std::vector<Example> const& dataset, PackerOptions const& options,
                                            PlanMode mode, std::uint64_t epoch) {
  EpochBatches out = fusepack_packer(dataset, options, mode, epoch);
  for (PackedBatch& pb : out.packed) {
    std::vector<std::int32_t> unshifted;
    for (std::size_t i = 0; i < static_cast<std::size_t>(pb.num_examples()); ++i) {  // a filler keeps its labels
      Example const& ex = dataset[static_cast<std::size_t>(pb.example_ids[i])];
      unshifted.insert(unshifted.end(), ex.labels.begin(),
                       ex.labels.begin() + (pb.cu_seqlens[i + 1] - pb.cu_seqlens[i]));
    }
    for (std::size_t t = 0; t < unshifted.size(); ++t) {
      pb.labels[t] = t + 1 < unshifted.size() ? unshifted[t + 1] : kIgnoreIndex;
    }
  }
  return out;
}

// The shuffle seed mixed with a process-wide call counter, standing in for a clock or std::random_device.
EpochBatches unseeded_packer(std::vector<Example> const& dataset, PackerOptions const& options, PlanMode mode,
                             std::uint64_t epoch) {
  static std::atomic<std::uint64_t> calls{0};
  PackerOptions reseeded = options;
  reseeded.seed = packing::mix_seed({options.seed, calls++});
  return fusepack_packer(dataset, reseeded, mode, epoch);
}

// The packer with each completed pack's filler tokens appended to its last example (no cu_seqlens entry of their own,
// positions continuing): ops would let the last example attend to them and carry state into them.
EpochBatches filler_in_last_example_packer(std::vector<Example> const& dataset, PackerOptions const& options,
                                           PlanMode mode, std::uint64_t epoch) {
  EpochBatches out = fusepack_packer(dataset, options, mode, epoch);
  for (PackedBatch& pb : out.packed) {
    if (pb.filler_tokens() == 0) continue;
    pb.example_ids.pop_back();
    pb.cu_seqlens.erase(pb.cu_seqlens.end() - 2);  // the filler's start: its tokens join the last example
    std::int32_t const start = pb.cu_seqlens[pb.cu_seqlens.size() - 2];
    std::int32_t longest = 0;
    for (std::size_t i = 0; i + 1 < pb.cu_seqlens.size(); ++i) {
      longest = std::max(longest, pb.cu_seqlens[i + 1] - pb.cu_seqlens[i]);
    }
    pb.max_seqlen = longest;
    for (std::size_t t = static_cast<std::size_t>(start); t < pb.tokens.size(); ++t) {
      pb.position_ids[t] = static_cast<std::int32_t>(t) - start;
      pb.seq_idx[t] = static_cast<std::int32_t>(pb.example_ids.size() - 1);
    }
  }
  return out;
}

// The packer with each filler's labels its next tokens (the HF shift applied to the filler as to an example).
EpochBatches filler_with_targets_packer(std::vector<Example> const& dataset, PackerOptions const& options,
                                        PlanMode mode, std::uint64_t epoch) {
  EpochBatches out = fusepack_packer(dataset, options, mode, epoch);
  for (PackedBatch& pb : out.packed) {
    auto const filler = static_cast<std::size_t>(pb.filler_tokens());
    for (std::size_t t = pb.tokens.size() - filler; t + 1 < pb.tokens.size(); ++t) pb.labels[t] = pb.tokens[t + 1];
  }
  return out;
}

// Paired mode whose padded side is planned on its own (rows x longest <= budget), so steps hold other examples.
EpochBatches unpaired_packer(std::vector<Example> const& dataset, PackerOptions const& options, PlanMode,
                             std::uint64_t epoch) {
  std::vector<std::int64_t> const lengths = packing::example_lengths(dataset);
  return batches_of(dataset, options, packing::plan_packed(lengths, options, epoch),
                    packing::plan_padded(lengths, options, epoch));
}

TEST(PackingInvariants, EverySupervisedTokenOncePerEpochInOrder) {
  check_property([] { check_every_supervised_token_once(fusepack_packer); });
}

TEST(PackingInvariants, TokenBudgetHolds) {
  check_property([] { check_budget(fusepack_packer); });
}

TEST(PackingInvariants, CuSeqlensSeqIdxPositionIdsAgree) {
  check_property([] { check_layout(fusepack_packer); });
}

TEST(PackingInvariants, NoLabelCrossesAnExample) {
  check_property([] { check_labels_per_example(fusepack_packer); });
}

TEST(PackingInvariants, SameSeedSameBatches) {
  check_property([] { check_same_seed_same_batches(fusepack_packer); });
}

TEST(PackingInvariants, PairedModeSameExamplesAndTargetsInBothPaths) {
  check_property([] { check_paired(fusepack_packer); });
}

TEST(PackingInvariants, APackCompletedToTheBudgetIsThePackPlusAnIsolatedFillerWithoutTargets) {
  check_property([] { check_filler(fusepack_packer); });
}

TEST(PackingInvariants, PlantedFillerAppendedToTheLastExampleFailsTheFillerProperty) {
  check_planted("filler tokens appended to the pack's last example instead of an example of their own",
                [] { check_filler(filler_in_last_example_packer); });
}

TEST(PackingInvariants, PlantedFillerWithTargetsFailsTheFillerProperty) {
  check_planted("a filler whose labels are its next tokens (targets the loss would count)",
                [] { check_filler(filler_with_targets_packer); });
}

TEST(PackingInvariants, PlantedSplittingPackerFailsEverySupervisedTokenOnce) {
  check_planted("a packer that splits an example across two batches",
                [] { check_every_supervised_token_once(splitting_packer); });
}

TEST(PackingInvariants, PlantedDroppingPackerFailsEverySupervisedTokenOnce) {
  check_planted("a packer that drops the example that does not fit",
                [] { check_every_supervised_token_once(dropping_packer); });
}

TEST(PackingInvariants, PlantedOverflowingPackerFailsTokenBudget) {
  check_planted("a packer that closes a batch only once it is at or over the budget",
                [] { check_budget(overflowing_packer); });
}

TEST(PackingInvariants, PlantedPositionsNotRestartingFailLayout) {
  check_planted("position_ids not restarting per example (0..T-1 over the pack)",
                [] { check_layout(positions_not_restarting_packer); });
}

TEST(PackingInvariants, PlantedLabelsShiftedPerPackFailNoLabelCrossing) {
  check_planted("labels shifted once per pack instead of per example",
                [] { check_labels_per_example(labels_shifted_per_pack_packer); });
}

TEST(PackingInvariants, PlantedUnseededShuffleFailsSameSeedSameBatches) {
  check_planted("a shuffle seeded from process state, not from the options' seed",
                [] { check_same_seed_same_batches(unseeded_packer); });
}

TEST(PackingInvariants, PlantedUnpairedPaddedPlanFailsPairedMode) {
  check_planted("paired mode whose padded batches are planned separately", [] { check_paired(unpaired_packer); });
}

}  // namespace
}  // namespace fusepack::props
