// Token cross-entropy with ignored targets, fp64 reference. Labels are the already-shifted targets of a
// PackedBatch (labels[t] is the token that logits[t] must predict, or ignore_index).
//   loss_sum = Σ_{t: labels[t] != ignore_index} (logsumexp(logits[t]) − logits[t, labels[t]])
// The caller divides by the number of targets counted over the whole optimizer step (docs/contracts.md, batches).
#pragma once

#include "reference/tensor.h"

#include <cstdint>
#include <vector>

namespace fusepack::ref {

inline constexpr std::int64_t kIgnoreIndex = -100;

struct CrossEntropyOut {
  double loss_sum = 0;
  Index num_targets = 0;
};

// logits: [T, vocab]; labels: [T], each in [0, vocab) or ignore_index.
CrossEntropyOut cross_entropy_fwd(Tensor const& logits, std::vector<std::int64_t> const& labels,
                                  std::int64_t ignore_index = kIgnoreIndex);
// d(dloss_sum · loss_sum)/d logits: dloss_sum · (softmax(logits[t]) − onehot(labels[t])) on target rows, 0 elsewhere.
Tensor cross_entropy_bwd(double dloss_sum, Tensor const& logits, std::vector<std::int64_t> const& labels,
                         std::int64_t ignore_index = kIgnoreIndex);

}  // namespace fusepack::ref
