#include "trainer/train/trainer.h"

#include "kernels/ops/op_scope.h"
#include "trainer/optim/grad_clip.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace fusepack::train {
std::vector<optim::NamedParameter> model_parameters(model::Qwen35ForCausalLM const& model) {
  std::vector<optim::NamedParameter> out;
  for (auto const& [name, p] : model.named_parameters()) out.push_back({name, p});
  return out;
}

Trainer::Trainer(model::Qwen35ForCausalLM& model, TrainerOptions options)
    : model_(model),
      own_weights_(std::make_unique<model::LocalWeights>(model.config(), model.named_parameters(),
                                                         model.mixed_precision())),
      weights_(*own_weights_),
      options_(std::move(options)),
      params_(model_parameters(model)),
      adamw_(params_, options_.adamw) {
  check_options();
  adamw_.set_compute_copies(weights_.compute_copies());
}

Trainer::Trainer(model::Qwen35ForCausalLM const& model, model::WeightSource& weights,
                 std::vector<optim::NamedParameter> params, TrainerOptions options)
    : model_(model),
      weights_(weights),
      options_(std::move(options)),
      params_(std::move(params)),
      adamw_(params_, options_.adamw) {
  check_options();
  adamw_.set_compute_copies(weights_.compute_copies());
}

void Trainer::resume_after(std::int64_t steps_taken) {
  if (steps_taken < 0 || steps_taken > options_.schedule.total_steps) {
    throw std::out_of_range("Trainer::resume_after: " + std::to_string(steps_taken) + " steps taken, but the schedule "
                            "has " + std::to_string(options_.schedule.total_steps));
  }
  steps_taken_ = steps_taken;
}

void Trainer::check_options() const {
  options_.schedule.validate();
  if (!(std::isfinite(options_.clip_norm) && options_.clip_norm >= 0)) {
    throw std::invalid_argument("Trainer: clip_norm must be finite and >= 0 (0 = no clipping); got " +
                                std::to_string(options_.clip_norm));
  }
}

StepResult Trainer::step(std::vector<model::ModelBatch> const& micro_batches) {
  begin_step(micro_batches);
  return finish_step();
}

void Trainer::begin_step(std::vector<model::ModelBatch> const& micro_batches) {
  if (pending_) {
    throw std::logic_error("Trainer::begin_step: step " + std::to_string(pending_->result.step) +
                           " was begun and not finished");
  }
  if (micro_batches.empty()) throw std::invalid_argument("Trainer::step: a step needs at least one micro-batch");
  if (steps_taken_ >= options_.schedule.total_steps) {
    throw std::out_of_range("Trainer::step: the schedule has " + std::to_string(options_.schedule.total_steps) +
                            " steps and all of them were taken");
  }
  StepResult r;
  r.step = steps_taken_;
  r.lr = options_.schedule.lr(r.step);

  for (optim::NamedParameter& p : params_) p.param.mutable_grad() = at::Tensor();  // zero_grad(set_to_none=True)
  ops::reset_op_run_counts();

  // Count first (docs/contracts.md, batches): every micro-batch's loss is divided by the whole step's target count.
  std::vector<std::int64_t> counts;
  for (model::ModelBatch const& b : micro_batches) counts.push_back(b.num_targets);
  optim::StepLossNormalizer normalizer(counts, options_.all_reduce);
  for (model::ModelBatch const& b : micro_batches) {
    model::ForwardOutput const out = model_.forward(b, weights_);
    normalizer.normalize(optim::TokenLossSum::from_sum(out.loss_sum, out.num_targets)).backward();
    weights_.finish_backward();
  }
  // No silent fallback: every op of the step ran the backend the model asked for, as each op recorded where it ran.
  std::vector<ops::OpRunCount> const stray = ops::op_runs_not_on(model_.backend());
  if (!stray.empty()) {
    throw std::runtime_error("Trainer::step " + std::to_string(r.step) + ": the run asked for the " +
                             ops::backend_name(model_.backend()) + " backend, but " + ops::describe_op_runs(stray) +
                             "; the step is not applied");
  }
  // The norm's kernels queued behind the backward: finish_step's first read waits for both at once.
  std::optional<optim::QueuedGradNorm> norm;
  {
    FUSEPACK_PROFILE_RANGE(range, FUSEPACK_RANGE_PREFIX "optimizer");
    norm = optim::queue_grad_norm(params_, options_.all_reduce);
  }
  pending_.emplace(Pending{r, std::move(normalizer), std::move(*norm)});
}

StepResult Trainer::finish_step() {
  if (!pending_) throw std::logic_error("Trainer::finish_step: no step was begun");
  Pending pending = std::move(*pending_);
  pending_.reset();
  StepResult r = pending.result;
  r.loss = pending.normalizer.step_loss();
  r.targets = pending.normalizer.global_targets();
  FUSEPACK_PROFILE_RANGE(range, FUSEPACK_RANGE_PREFIX "optimizer");
  // Throws NonFiniteGradNorm before any update. Clipping's factor goes into the update, which reads the gradients
  // scaled (no pass of its own on CUDA).
  r.grad_norm = pending.grad_norm.read(params_);
  adamw_.step(r.lr, options_.clip_norm > 0 ? optim::clip_factor(r.grad_norm, options_.clip_norm) : 1.0);
  ++steps_taken_;
  return r;
}

Trainer::EvalSums Trainer::evaluate(model::ModelBatch const& micro_batch) {
  at::NoGradGuard no_grad;
  ops::reset_op_run_counts();
  model::ForwardOutput const out = model_.forward(micro_batch, weights_);
  std::vector<ops::OpRunCount> const stray = ops::op_runs_not_on(model_.backend());
  if (!stray.empty()) {
    throw std::runtime_error("Trainer::evaluate after step " + std::to_string(steps_taken_ - 1) + ": the run asked for "
                             "the " + ops::backend_name(model_.backend()) + " backend, but " +
                             ops::describe_op_runs(stray));
  }
  return {out.loss_sum.item<double>(), out.num_targets};
}

}  // namespace fusepack::train
