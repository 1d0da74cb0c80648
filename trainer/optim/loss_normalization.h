// Step-level loss normalisation (docs/contracts.md, batches): the loss of an optimizer step is
//   Σ token cross-entropies / number of target tokens, both over all micro-batches and all ranks of the step,
// so every target token weighs the same however the step is cut into micro-batches, packs or ranks. Targets are
// counted first; then each micro-batch's *summed* loss is divided by the global count before its backward.
#pragma once

#include "packing/example.h"
#include "trainer/optim/parameters.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fusepack::optim {

// A micro-batch's loss as a sum over its targets, with the number of targets it sums over. It is the only loss
// StepLossNormalizer accepts: a per-micro-batch mean (what a plain cross_entropy returns) cannot be passed by
// accident; building one from a raw tensor is the explicit TokenLossSum::from_sum.
struct TokenLossSum {
  at::Tensor sum;             // 0-dim floating, Σ over the targets of CE(logits[t], labels[t]), with autograd history
  std::int64_t targets = 0;   // how many targets (labels != -100) the sum runs over

  // `sum` must be a reduction="sum" loss over exactly `targets` targets (a model with its own fused loss).
  static TokenLossSum from_sum(at::Tensor sum, std::int64_t targets);
};

// HF's token loss (loss_utils ForCausalLMLoss with num_items_in_batch): cross-entropy of logits.float() (fp64 stays
// fp64) against labels that are already shifted, reduction sum, ignore_index -100.
// logits: [..., V] floating; labels: [...] integer, the same leading shape. Counting the targets reads the labels
// (a device-to-host copy on the GPU).
TokenLossSum cross_entropy_sum(at::Tensor const& logits, at::Tensor const& labels);

// Number of targets in a labels tensor (labels != -100), for counting a step's micro-batches before any forward.
std::int64_t count_targets(at::Tensor const& labels);

// One optimizer step's normalisation. Use:
//   StepLossNormalizer norm({batch0.num_targets(), batch1.num_targets()}, all_reduce);   // count first
//   for each micro-batch i, in order:  norm.normalize(cross_entropy_sum(logits_i, labels_i)).backward();
//   double loss = norm.step_loss();   // the step's loss, the same on every rank
// Gradients of the ranks must then be SUMMED (reduce-scatter/all-reduce SUM, no 1/world_size): the division by the
// global count already makes them the gradient of the global per-token mean.
class StepLossNormalizer {
 public:
  // `micro_batch_targets`: this rank's micro-batches' target counts, in the order they will be normalised (a rank
  // may have none, or micro-batches without targets). `all_reduce` sums the count over ranks (an int64 0-dim CPU
  // tensor); empty for one rank. Throws c10::Error for a negative count or no target at all in the step.
  explicit StepLossNormalizer(std::vector<std::int64_t> micro_batch_targets, AllReduceSum all_reduce = {});

  std::int64_t global_targets() const { return global_targets_; }
  std::int64_t local_targets() const { return local_targets_; }
  std::int64_t num_micro_batches() const { return static_cast<std::int64_t>(counts_.size()); }
  std::int64_t normalized() const { return next_; }  // micro-batches normalised so far

  // loss.sum / global_targets, the tensor to call backward() on, for the next micro-batch in order. Throws when
  // loss.targets differs from the count given for it (the forward saw other targets than were counted), or when
  // every micro-batch was already normalised.
  at::Tensor normalize(TokenLossSum const& loss);

  // Σ over all micro-batches and ranks of the summed losses / global_targets: the step's loss, identical on every
  // rank (an all-reduce of this rank's fp64 sum). Throws unless every micro-batch was normalised.
  double step_loss();

 private:
  std::vector<std::int64_t> counts_;
  AllReduceSum all_reduce_;
  std::int64_t local_targets_ = 0;
  std::int64_t global_targets_ = 0;
  std::int64_t next_ = 0;
  at::Tensor local_sum_;  // Σ of the detached summed losses so far, fp64 0-dim on the losses' device
};

}  // namespace fusepack::optim
