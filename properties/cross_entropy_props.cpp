// cross_entropy no-leak properties on random datasets packed by packing/ (docs/contracts.md, no leakage, channels 5 and
// 6: no target crosses an example; the loss is normalized per token over the whole step), and the planted leaks they
// must catch:
//   - labels shifted once over the pack instead of per example (the bug fixed by torchtune
//     PR #2613): each example's last token gets the next example's first token as
//     its target;
//   - the loss averaged per micro-batch instead of per token (the HF transformers PR #34191 gradient-accumulation bug).
// Logits are drawn per (example, position), so an example's logits are the same wherever it is packed.
#include "properties/check.h"
#include "properties/gen/datasets.h"
#include "properties/gen/packings.h"
#include "properties/leak.h"
#include "properties/require.h"
#include "packing/batch.h"
#include "reference/cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace fusepack::props {
namespace {

using packing::Example;
using packing::PackedBatch;
using ref::Index;
using ref::Tensor;

DatasetLimits const kLimits{/*max_examples=*/8, /*max_length=*/10, /*vocab_size=*/7};

// How the labels of a pack are made: the packer's own per-example shift, or a planted variant.
using Packer = PackedBatch (*)(std::vector<Example> const& dataset, std::vector<std::int64_t> const& ids);

PackedBatch pack_per_example(std::vector<Example> const& dataset, std::vector<std::int64_t> const& ids) {
  return packing::make_packed_batch(dataset, ids);
}

// Planted: the unshifted labels of the whole pack shifted by one, -100 only at the pack's last token.
PackedBatch pack_shifted_once(std::vector<Example> const& dataset, std::vector<std::int64_t> const& ids) {
  PackedBatch batch = packing::make_packed_batch(dataset, ids);
  std::vector<std::int32_t> unshifted;
  for (std::int64_t id : ids) {
    auto const& l = dataset[static_cast<std::size_t>(id)].labels;
    unshifted.insert(unshifted.end(), l.begin(), l.end());
  }
  for (std::size_t t = 0; t < batch.labels.size(); ++t) {
    batch.labels[t] = t + 1 < unshifted.size() ? unshifted[t + 1] : packing::kIgnoreIndex;
  }
  return batch;
}

// Logits [T, vocab] of the examples `ids`, in order; example id's row p drawn from (example_seeds[id], p).
Tensor pack_logits(std::vector<Example> const& dataset, std::vector<std::uint64_t> const& example_seeds,
                   std::vector<std::int64_t> const& ids) {
  std::vector<Tensor> rows;
  for (std::int64_t id : ids) {
    auto const len = static_cast<Index>(dataset[static_cast<std::size_t>(id)].input_ids.size());
    for (Index p = 0; p < len; ++p) {
      rows.push_back(normal_tensor({1, kLimits.vocab_size}, mix({example_seeds[static_cast<std::size_t>(id)],
                                                                  static_cast<std::uint64_t>(p)})));
    }
  }
  return cat_rows(rows);
}

std::vector<std::int64_t> all_ids(std::size_t n) {
  std::vector<std::int64_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int64_t>(i);
  return ids;
}

std::vector<std::uint64_t> draw_example_seeds(std::size_t n) {
  std::uint64_t const seed = (*gen::seed()).value;
  std::vector<std::uint64_t> seeds;
  for (std::size_t i = 0; i < n; ++i) seeds.push_back(mix({seed, i}));
  return seeds;
}

// Labels for the reference: the batch's labels where keep(t), -100 elsewhere.
template <class Keep>
std::vector<std::int64_t> labels_where(PackedBatch const& batch, Keep keep) {
  std::vector<std::int64_t> out(batch.labels.size(), ref::kIgnoreIndex);
  for (std::size_t t = 0; t < out.size(); ++t) {
    if (keep(t)) out[t] = batch.labels[t];
  }
  return out;
}

ref::CrossEntropyOut token_loss(Tensor const& logits, PackedBatch const& batch, Index t) {
  return ref::cross_entropy_fwd(rows(logits, t, 1), {batch.labels[static_cast<std::size_t>(t)]});
}

void check_isolation(Packer pack) {
  std::vector<Example> const dataset = *gen::dataset(kLimits);
  std::vector<std::uint64_t> const seeds = draw_example_seeds(dataset.size());
  std::vector<std::int64_t> const ids = all_ids(dataset.size());
  PackedBatch const batch = pack(dataset, ids);
  Tensor const logits = pack_logits(dataset, seeds, ids);
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(ids.size()); ++i) {
    ref::CrossEntropyOut const in_pack =
        ref::cross_entropy_fwd(logits, labels_where(batch, [&](std::size_t t) { return batch.seq_idx[t] == i; }));
    PackedBatch const single = pack(dataset, {i});
    std::vector<std::int64_t> const alone_labels(single.labels.begin(), single.labels.end());
    ref::CrossEntropyOut const alone = ref::cross_entropy_fwd(pack_logits(dataset, seeds, {i}), alone_labels);
    FUSEPACK_RC_REQUIRE(in_pack.num_targets == alone.num_targets && in_pack.loss_sum == alone.loss_sum,
                        "example " << i << " of " << ids.size() << ": in the pack " << in_pack.num_targets
                                   << " targets, loss sum " << in_pack.loss_sum << "; alone " << alone.num_targets
                                   << " targets, loss sum " << alone.loss_sum);
  }
}

void check_perturbation_invariance(Packer pack) {
  std::vector<Example> const dataset = *gen::dataset(kLimits);
  std::vector<std::uint64_t> const seeds = draw_example_seeds(dataset.size());
  auto const j = static_cast<std::size_t>((*gen::example_index(static_cast<std::int32_t>(dataset.size()))).value);
  Example const replacement = *gen::example(kLimits);
  std::vector<Example> dataset2 = dataset;
  std::vector<std::uint64_t> seeds2 = seeds;
  dataset2[j] = replacement;
  seeds2[j] = mix({seeds[j], 0x5045});  // "PE": new logits too
  std::vector<std::int64_t> const ids = all_ids(dataset.size());
  PackedBatch const batch = pack(dataset, ids), batch2 = pack(dataset2, ids);
  Tensor const logits = pack_logits(dataset, seeds, ids), logits2 = pack_logits(dataset2, seeds2, ids);
  for (std::size_t n = 0; n < ids.size(); ++n) {
    if (n == j) continue;
    for (std::int32_t p = 0; p < batch.cu_seqlens[n + 1] - batch.cu_seqlens[n]; ++p) {
      ref::CrossEntropyOut const before = token_loss(logits, batch, batch.cu_seqlens[n] + p);
      ref::CrossEntropyOut const after = token_loss(logits2, batch2, batch2.cu_seqlens[n] + p);
      FUSEPACK_RC_REQUIRE(before.num_targets == after.num_targets && before.loss_sum == after.loss_sum,
                          "replacing example " << j << " changed the loss of example " << n << " position " << p
                                               << ": targets " << before.num_targets << " -> " << after.num_targets
                                               << ", loss " << before.loss_sum << " -> " << after.loss_sum);
    }
  }
}

void check_zero_cross_gradient(Packer pack) {
  // The loss of example i sums the targets drawn from example i's tokens: labels[t] is token t+1, so its owner is
  // seq_idx[t+1] (a target at the pack's last token has no next token and counts for its own example).
  std::vector<Example> const dataset = *gen::dataset(kLimits);
  std::vector<std::uint64_t> const seeds = draw_example_seeds(dataset.size());
  std::int32_t const i = (*gen::example_index(static_cast<std::int32_t>(dataset.size()))).value;
  std::vector<std::int64_t> const ids = all_ids(dataset.size());
  PackedBatch const batch = pack(dataset, ids);
  Tensor const logits = pack_logits(dataset, seeds, ids);
  auto const T = batch.labels.size();
  Tensor const dlogits = ref::cross_entropy_bwd(
      1.0, logits, labels_where(batch, [&](std::size_t t) { return batch.seq_idx[std::min(t + 1, T - 1)] == i; }));
  for (std::size_t t = 0; t < T; ++t) {
    if (batch.seq_idx[t] == i) continue;
    bool const zero = rows(dlogits, static_cast<Index>(t), 1).flat().isZero(0);
    FUSEPACK_RC_REQUIRE(zero, "the loss of example " << i << " has a nonzero gradient on the logits of example "
                                                     << batch.seq_idx[t] << " (token " << t << ", label "
                                                     << batch.labels[t] << ")");
  }
}

// The loss of a step from its micro-batches' (loss sum, target count).
using Normalizer = double (*)(std::vector<ref::CrossEntropyOut> const& micro_batches);

double per_token(std::vector<ref::CrossEntropyOut> const& mbs) {
  double sum = 0;
  Index count = 0;
  for (auto const& mb : mbs) {
    sum += mb.loss_sum;
    count += mb.num_targets;
  }
  return sum / static_cast<double>(count);
}

// Planted: each micro-batch's mean, averaged over the micro-batches that have targets.
double per_micro_batch(std::vector<ref::CrossEntropyOut> const& mbs) {
  double sum = 0;
  int counted = 0;
  for (auto const& mb : mbs) {
    if (mb.num_targets == 0) continue;
    sum += mb.loss_sum / static_cast<double>(mb.num_targets);
    ++counted;
  }
  return sum / counted;
}

void check_loss_normalization(Normalizer step_loss) {
  // The step's examples cut into contiguous micro-batches at random points, against the step as one micro-batch.
  std::vector<Example> const dataset = *gen::dataset(kLimits);
  std::vector<std::uint64_t> const seeds = draw_example_seeds(dataset.size());
  std::vector<bool> const cut_after = *rc::gen::container<std::vector<bool>>(dataset.size() - 1,
                                                                             rc::gen::arbitrary<bool>());
  std::vector<std::vector<std::int64_t>> micro_batches{{}};
  for (std::size_t n = 0; n < dataset.size(); ++n) {
    micro_batches.back().push_back(static_cast<std::int64_t>(n));
    if (n + 1 < dataset.size() && cut_after[n]) micro_batches.emplace_back();
  }
  auto loss_of = [&](std::vector<std::int64_t> const& ids) {
    PackedBatch const batch = packing::make_packed_batch(dataset, ids);
    return ref::cross_entropy_fwd(pack_logits(dataset, seeds, ids),
                                  std::vector<std::int64_t>(batch.labels.begin(), batch.labels.end()));
  };
  ref::CrossEntropyOut const whole = loss_of(all_ids(dataset.size()));
  RC_PRE(whole.num_targets > 0);
  std::vector<ref::CrossEntropyOut> split;
  for (auto const& ids : micro_batches) split.push_back(loss_of(ids));
  double const expected = step_loss({whole}), got = step_loss(split);
  // The split sums the same token losses in another order: equal to rounding.
  FUSEPACK_RC_REQUIRE(std::abs(got - expected) <= 1e-12 * std::max(1.0, std::abs(expected)),
                      "step loss " << got << " over " << micro_batches.size()
                                   << " micro-batches, " << expected << " over one (" << whole.num_targets
                                   << " targets in all)");
}

char const kShiftedPerPack[] = "labels shifted once per pack instead of per example";
char const kPerMicroBatch[] = "loss averaged per micro-batch instead of per token";

TEST(CrossEntropyNoLeak, Isolation) {
  check_property([] { check_isolation(pack_per_example); });
}

TEST(CrossEntropyNoLeak, PerturbationInvariance) {
  check_property([] { check_perturbation_invariance(pack_per_example); });
}

TEST(CrossEntropyNoLeak, ZeroCrossGradient) {
  check_property([] { check_zero_cross_gradient(pack_per_example); });
}

TEST(CrossEntropyNoLeak, LossNormalizationInvariantToMicroBatchSplit) {
  check_property([] { check_loss_normalization(per_token); });
}

TEST(CrossEntropyNoLeak, PlantedLabelsShiftedPerPackFailIsolation) {
  check_planted(kShiftedPerPack, [] { check_isolation(pack_shifted_once); });
}

TEST(CrossEntropyNoLeak, PlantedLabelsShiftedPerPackFailPerturbationInvariance) {
  check_planted(kShiftedPerPack, [] { check_perturbation_invariance(pack_shifted_once); });
}

TEST(CrossEntropyNoLeak, PlantedLabelsShiftedPerPackFailZeroCrossGradient) {
  check_planted(kShiftedPerPack, [] { check_zero_cross_gradient(pack_shifted_once); });
}

TEST(CrossEntropyNoLeak, PlantedLossPerMicroBatchFailsNormalization) {
  check_planted(kPerMicroBatch, [] { check_loss_normalization(per_micro_batch); });
}

}  // namespace
}  // namespace fusepack::props
