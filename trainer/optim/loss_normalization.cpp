#include "trainer/optim/loss_normalization.h"

#include <ATen/ATen.h>

namespace fusepack::optim {

TokenLossSum TokenLossSum::from_sum(at::Tensor sum, std::int64_t targets) {
  TORCH_CHECK(sum.defined(), "TokenLossSum: the loss sum is undefined");
  TORCH_CHECK(sum.dim() == 0, "TokenLossSum: the loss sum must be a 0-dim tensor; got shape ", sum.sizes());
  TORCH_CHECK(at::isFloatingType(sum.scalar_type()), "TokenLossSum: the loss sum must be floating; got ",
              sum.scalar_type());
  TORCH_CHECK(targets >= 0, "TokenLossSum: targets must be >= 0; got ", targets);
  TokenLossSum out;
  out.sum = std::move(sum);
  out.targets = targets;
  return out;
}

std::int64_t count_targets(at::Tensor const& labels) {
  TORCH_CHECK(labels.defined(), "count_targets: labels is undefined");
  TORCH_CHECK(at::isIntegralType(labels.scalar_type(), /*includeBool=*/false),
              "count_targets: labels must be integer; got ", labels.scalar_type());
  return labels.ne(packing::kIgnoreIndex).sum().item<std::int64_t>();
}

TokenLossSum cross_entropy_sum(at::Tensor const& logits, at::Tensor const& labels) {
  TORCH_CHECK(logits.defined() && labels.defined(), "cross_entropy_sum: logits and labels are required");
  TORCH_CHECK(logits.dim() >= 1 && logits.dim() == labels.dim() + 1,
              "cross_entropy_sum: logits must be [..., V] and labels [...]; got logits ", logits.sizes(), " and labels ",
              labels.sizes());
  TORCH_CHECK(logits.sizes().slice(0, labels.dim()) == labels.sizes(), "cross_entropy_sum: logits ", logits.sizes(),
              " and labels ", labels.sizes(), " differ in the leading dimensions");
  TORCH_CHECK(at::isFloatingType(logits.scalar_type()), "cross_entropy_sum: logits must be floating; got ",
              logits.scalar_type());
  std::int64_t const vocab = logits.size(-1);
  at::Tensor const flat_logits = logits.reshape({-1, vocab}).to(at::promote_types(logits.scalar_type(), at::kFloat));
  at::Tensor const flat_labels = labels.reshape({-1}).to(at::kLong);
  at::Tensor const sum = at::cross_entropy_loss(flat_logits, flat_labels, /*weight=*/{}, at::Reduction::Sum,
                                                packing::kIgnoreIndex);
  return TokenLossSum::from_sum(sum, count_targets(labels));
}

StepLossNormalizer::StepLossNormalizer(std::vector<std::int64_t> micro_batch_targets, AllReduceSum all_reduce)
    : counts_(std::move(micro_batch_targets)), all_reduce_(std::move(all_reduce)) {
  for (std::size_t i = 0; i < counts_.size(); ++i) {
    TORCH_CHECK(counts_[i] >= 0, "StepLossNormalizer: micro-batch ", i, " has ", counts_[i],
                " targets; counts must be >= 0");
    local_targets_ += counts_[i];
  }
  at::Tensor count = at::full({}, local_targets_, at::TensorOptions().dtype(at::kLong));
  if (all_reduce_) all_reduce_(count);
  global_targets_ = count.item<std::int64_t>();
  TORCH_CHECK(global_targets_ > 0, "StepLossNormalizer: the step has no target token on any rank (this rank: ",
              local_targets_, " over ", counts_.size(), " micro-batches); its loss is undefined");
  TORCH_CHECK(global_targets_ >= local_targets_, "StepLossNormalizer: the all-reduced target count ", global_targets_,
              " is below this rank's ", local_targets_, "; the all-reduce callback must SUM");
}

at::Tensor StepLossNormalizer::normalize(TokenLossSum const& loss) {
  TORCH_CHECK(next_ < num_micro_batches(), "StepLossNormalizer::normalize: all ", num_micro_batches(),
              " counted micro-batches were already normalised; a micro-batch that was not counted cannot join the "
              "step");
  TORCH_CHECK(loss.sum.defined() && loss.sum.dim() == 0, "StepLossNormalizer::normalize: micro-batch ", next_,
              ": the loss sum must be a defined 0-dim tensor");
  std::int64_t const counted = counts_[static_cast<std::size_t>(next_)];
  TORCH_CHECK(loss.targets == counted, "StepLossNormalizer::normalize: micro-batch ", next_, " sums over ",
              loss.targets, " targets but ", counted, " were counted for it before the step; the forward must "
              "supervise exactly the counted targets");
  at::Tensor const detached = loss.sum.detach().to(at::kDouble);
  local_sum_ = local_sum_.defined() ? local_sum_ + detached : detached;
  ++next_;
  return loss.sum / static_cast<double>(global_targets_);
}

double StepLossNormalizer::step_loss() {
  TORCH_CHECK(next_ == num_micro_batches(), "StepLossNormalizer::step_loss: ", next_, " of ", num_micro_batches(),
              " counted micro-batches were normalised; every counted micro-batch must run before the step's loss "
              "is known");
  at::Tensor sum = local_sum_.defined() ? local_sum_.clone() : at::zeros({}, at::TensorOptions().dtype(at::kDouble));
  if (all_reduce_) all_reduce_(sum);
  return sum.item<double>() / static_cast<double>(global_targets_);
}

}  // namespace fusepack::optim
