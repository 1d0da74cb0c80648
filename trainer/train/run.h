// One fine-tuning run from a TrainConfig, what fusepack-train does: build the model (preset or config.json, optional
// weights), load the data (JSONL or synthetic), plan epochs with the packer, group micro-batches into optimizer steps
// (Trainer), log every step (and draw a progress bar), evaluate a held-out set every N steps, print the summary, write
// the fine-tuned weights, write the run as a golden file and/or compare it with one step by step.
#pragma once

#include "golden/compare.h"
#include "golden/golden_file.h"
#include "packing/progress.h"
#include "trainer/model/batch.h"
#include "trainer/model/config.h"
#include "trainer/train/config.h"
#include "trainer/train/golden_check.h"
#include "trainer/train/profile.h"
#include "trainer/train/report.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fusepack::parallel {
class Collectives;
}

namespace fusepack::train {

// Tests only: edits a micro-batch after its invariants were checked and before the model sees it, to plant a bug
// that the golden comparison must catch (e.g. labels shifted across the whole pack). A training run never sets one.
using MicroBatchEdit = std::function<void(model::ModelBatch& batch)>;

struct RunOptions {
  // The command line that started the run, recorded as the golden's provenance.command. Empty = "(library call)".
  std::string command;
  // Step lines, summary, notes and the comparison table go here; nullptr = silent.
  std::ostream* log = nullptr;
  // Draw a progress bar on stderr, redrawn after each step line (fusepack-train: when stderr is a terminal).
  bool progress_bar = false;
  // Long phases before the first step (reading a large dataset, planning epochs, building a large model) and planning
  // a later epoch report here every 2 s while they run (packing/progress.h; fusepack-train: rank 0, on stderr);
  // nullptr = silent.
  packing::Progress const* progress = nullptr;
  // Tolerance of golden_check. Unset = golden::derived_tolerance(the run's dtype, the golden's).
  std::optional<golden::TolerancePolicy> tolerance;
  MicroBatchEdit edit_micro_batch;
  // A sharded run: this process is rank comm->rank() of comm->world_size() and trains its shards of the model
  // (trainer/parallel, FSDP2's semantics) on comm->device() (config.device is not read). Every rank must be given the
  // same config; only the log of the rank given one is written, and golden files and weights are written by rank 0.
  // Unset: one process trains the whole model on config.device.
  std::shared_ptr<parallel::Collectives> comm;
  // Polled between steps: non-zero (a signal number) stops the run there, after saving a training checkpoint when
  // config.save_dir is set (fusepack-train: SIGINT and SIGTERM). Every rank stops at the same step.
  std::function<int()> stop_requested;
};

struct RunResult {
  model::Qwen35Config model_config;
  int rank = 0;          // of the sharded run (0 for one process)
  int world_size = 1;
  double setup_seconds = 0;  // from the start of run_training to the first step (model, weights and data ready)
  std::int64_t peak_device_bytes = -1;  // on a GPU: the allocator's peak of allocated bytes over the steps; -1 on CPU
  // On a GPU: the most bytes allocated at the start of a step (weights, gradients and optimizer state held between
  // steps); peak_device_bytes minus this is what a step adds on top (activations and temporaries). -1 on the CPU.
  std::int64_t resident_device_bytes = -1;
  // One process on a GPU: the most bytes the decoder layers' forward kept for the backward in a micro-batch (what
  // activation checkpointing saves); -1 otherwise.
  std::int64_t layer_activation_bytes = -1;
  // The run's optimizer steps: config.steps, or with config.epochs the steps derived from the data. A dry run
  // (config.dry_run) sets it and returns with no steps.
  std::int64_t total_steps = 0;
  int interrupted_by = 0;       // the stop request (signal number) that ended the run early; 0 when it ran through
  std::string last_checkpoint;  // the training checkpoint saved last, if any
  std::vector<StepMetrics> steps;
  std::vector<EvalMetrics> evals;  // with config.eval_data: after every eval_every steps and after the last
  RunSummary summary;
  golden::GoldenFile golden;                     // the run in the golden format, with its provenance
  std::optional<golden::Comparison> comparison;  // when config.golden_check was given
  std::optional<StepProfile> profile;            // when config.profile_step was given

  std::vector<golden::StepRecord> records() const;
  bool passed() const { return !comparison || comparison->passed(); }  // no golden check, or it passed
};

// Validates `config` (TrainConfig::validate), reads golden_check before any work (a bad file fails fast), then runs.
// With config.epochs the steps are derived once the data is loaded (TrainConfig::epochs; a log line says how many
// micro-batches are left out). With config.dry_run it stops before building the model's parameters: it logs the plan
// (steps, epochs, tokens and examples per micro-batch, padding, memory of weights, gradients and AdamW state) and
// returns with no steps, having written and created no file.
// Throws std::invalid_argument for a bad config, data or weights (the message names the field or file),
// golden::GoldenError for a bad golden file, optim::NonFiniteGradNorm when a step's gradient is not finite, and
// whatever the model throws (e.g. the fused backend refusing an op: nothing falls back). A failed golden comparison is
// not an exception: see RunResult::passed.
RunResult run_training(TrainConfig const& config, RunOptions const& options = {});

// The model config of a run: the preset, or config.json (a file, or the folder holding it). Throws
// std::invalid_argument naming a missing file or an unknown preset.
model::Qwen35Config load_model_config(TrainConfig const& c);

// The fine-tuned weights as transformers loads them: config.json (Qwen35Config::to_json) and model.safetensors
// (Hugging Face names, the parameters' dtype) in `dir`, created if needed.
void write_weights(std::string const& dir, model::Qwen35Config const& config,
                   std::vector<std::pair<std::string, at::Tensor>> const& parameters);

}  // namespace fusepack::train
