// Trainer: one optimizer step over a model's micro-batches: count the step's targets first (summed over ranks), then
// per micro-batch forward → summed cross-entropy / the step's target count → backward (gradients accumulate), clip
// the global gradient norm, AdamW at the schedule's rate for this step. One rank trains the model's own parameters; a
// sharded run trains its shards, which its WeightSource gathers for the forward (trainer/parallel).
#pragma once

#include "trainer/model/batch.h"
#include "trainer/model/model.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/grad_clip.h"
#include "trainer/optim/loss_normalization.h"
#include "trainer/optim/parameters.h"
#include "trainer/optim/schedule.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace fusepack::train {

struct TrainerOptions {
  optim::AdamWOptions adamw;       // betas, eps, weight decay and which parameters it applies to
  optim::CosineSchedule schedule;  // lr(step) of every update; total_steps bounds how many steps may be taken
  double clip_norm = 1.0;          // >= 0: clip the global gradient norm to it; 0 = measure it, never clip
  // Sums the step's target count, loss and squared gradient norm over the data-parallel ranks; empty for one rank.
  optim::AllReduceSum all_reduce;
};

// What one optimizer step did; the fields of a golden record (golden/FORMAT.md).
struct StepResult {
  std::int64_t step = 0;     // 0-based optimizer step (the schedule's step)
  double loss = 0;           // Σ token CE over the step's micro-batches / targets, before the update
  double grad_norm = 0;      // global L2 norm of the gradients before clipping
  std::int64_t targets = 0;  // the step's targets (labels != -100) over all its micro-batches
  double lr = 0;             // the learning rate the update used
};

// The model's own parameters (shared tensors) as the optimizer names them: what a one-process Trainer trains.
std::vector<optim::NamedParameter> model_parameters(model::Qwen35ForCausalLM const& model);

class Trainer {
 public:
  // Registers every parameter of `model` (which must outlive the Trainer) with AdamW; validates the options (throws
  // std::invalid_argument for the schedule or clip_norm, c10::Error for AdamW's options).
  Trainer(model::Qwen35ForCausalLM& model, TrainerOptions options);
  // Trains `params`, the tensors behind the weights `weights` gives `model`'s forward (a rank's shards); the model
  // (which may be on the meta device) and the source must outlive the Trainer.
  Trainer(model::Qwen35ForCausalLM const& model, model::WeightSource& weights,
          std::vector<optim::NamedParameter> params, TrainerOptions options);

  // One optimizer step over `micro_batches` (>= 1, on the model's device), in order. Gradients are reset first
  // (set to none), so nothing carries over from an earlier step. Throws std::invalid_argument for no micro-batch,
  // c10::Error when the step has no target at all, optim::NonFiniteGradNorm when the gradient norm is NaN or infinite
  // (the parameters are then left as they were), std::out_of_range once schedule.total_steps steps were taken,
  // std::runtime_error (no update either) when an op of the step ran another implementation than the model's backend
  // (kernels/ops/op_scope.h: each op records where it ran).
  StepResult step(std::vector<model::ModelBatch> const& micro_batches);

  // step() in two halves, for a caller with host work to overlap with the GPU's: begin_step queues the forwards,
  // backwards and the gradient norm (nothing in it waits for the GPU on one rank), finish_step waits for them (one
  // wait: the loss, then the norm already computed), and queues the update. begin_step throws what step() throws for
  // its part and std::logic_error when a begun step was not finished; finish_step throws the rest, and
  // std::logic_error when no step was begun. A step that threw is over: the next begins afresh, with the parameters
  // as they were.
  void begin_step(std::vector<model::ModelBatch> const& micro_batches);
  StepResult finish_step();
  bool step_begun() const { return pending_.has_value(); }

  // One micro-batch's summed loss under the current weights, for evaluation: step()'s forward without gradients
  // (at::NoGradGuard), backward or update, so the training that follows is the same with or without it. On this rank
  // only (the caller sums over ranks). Throws std::runtime_error, as step() does, when an op of the forward ran another
  // implementation than the model's backend.
  struct EvalSums {
    double loss_sum = 0;       // Σ token CE of the micro-batch
    std::int64_t targets = 0;  // its labels != -100
  };
  EvalSums evaluate(model::ModelBatch const& micro_batch);

  std::int64_t steps_taken() const { return steps_taken_; }
  TrainerOptions const& options() const { return options_; }
  optim::AdamW const& optimizer() const { return adamw_; }
  optim::AdamW& optimizer() { return adamw_; }
  // Continues a run after `steps_taken` steps (a training checkpoint restored the weights and the optimizer state).
  // Throws std::out_of_range when the schedule has no step left after them.
  void resume_after(std::int64_t steps_taken);

 private:
  void check_options() const;

  model::Qwen35ForCausalLM const& model_;
  std::unique_ptr<model::LocalWeights> own_weights_;  // one rank: the model's own parameters
  model::WeightSource& weights_;
  TrainerOptions options_;
  std::vector<optim::NamedParameter> params_;  // shared tensors
  optim::AdamW adamw_;
  std::int64_t steps_taken_ = 0;
  struct Pending {
    StepResult result;
    optim::StepLossNormalizer normalizer;
    optim::QueuedGradNorm grad_norm;
  };
  std::optional<Pending> pending_;  // between begin_step and finish_step
};

}  // namespace fusepack::train
