// The run's data (trainer/train/run.h): the training and evaluation sets loaded and checked, and the plans that cut
// them into micro-batches, epoch after epoch. No torch.
#pragma once

#include "packing/example.h"
#include "packing/packer.h"
#include "packing/progress.h"
#include "trainer/train/config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fusepack::train {

// A data source as fusepack-train's --data and --eval-data take it: "synthetic:..." or a JSONL file.
bool is_synthetic(std::string const& data);

// A loaded data set.
struct Data {
  std::vector<packing::Example> examples;
  std::vector<std::int64_t> lines;     // each example's line in the JSONL file; empty for synthetic data
  nlohmann::ordered_json description;  // provenance.dataset
  std::uint64_t content_hash = 0;      // of every example's ids and labels
};

// `data` as given to `option` (--data or --eval-data, which messages name): a synthetic spec or a JSONL file; its
// provenance description and a content hash every rank compares.
Data load_data(std::string const& data, std::string const& option, std::int64_t vocab_size,
               packing::Progress const* progress);

// Every example must keep a target token once cut to the budget; throws naming the first few that do not.
void check_targets(Data const& d, std::string const& data, TrainConfig const& c);

packing::PackerOptions packer_options(TrainConfig const& c);

// The micro-batches of epoch `epoch` in the layout the run trains on.
std::vector<packing::BatchPlan> epoch_micro_batches(std::vector<std::int64_t> const& lengths,
                                                   packing::PackerOptions const& options, packing::PlanMode mode,
                                                   Batching batching, std::uint64_t epoch,
                                                   packing::Progress const* progress = nullptr);

// The plans of successive epochs, one micro-batch at a time, in the layout the run trains on.
class MicroBatchStream {
 public:
  MicroBatchStream(std::vector<std::int64_t> lengths, packing::PackerOptions options, packing::PlanMode mode,
                   Batching batching, packing::Progress const* progress = nullptr)
      : lengths_(std::move(lengths)), options_(options), mode_(mode), batching_(batching), progress_(progress) {}

  packing::BatchPlan const& next() {
    while (next_ >= plans_.size()) start_epoch(epoch_);
    return plans_[next_++];
  }
  std::uint64_t epochs_started() const { return epoch_; }
  std::int64_t next_in_epoch() const { return static_cast<std::int64_t>(next_); }
  std::int64_t epoch_size() const { return static_cast<std::int64_t>(plans_.size()); }  // of the current epoch
  // Back to where a checkpoint left it: the plan of epoch `epochs_started` - 1, at entry `next`.
  void restore(std::uint64_t epochs_started, std::int64_t next);

 private:
  // Draws epoch `epoch`'s plan (a function of the seed and the epoch) and starts at its first micro-batch.
  void start_epoch(std::uint64_t epoch);

  std::vector<std::int64_t> lengths_;
  packing::PackerOptions options_;
  packing::PlanMode mode_;
  Batching batching_;
  packing::Progress const* progress_;
  std::vector<packing::BatchPlan> plans_;
  std::size_t next_ = 0;
  std::uint64_t epoch_ = 0;
};

// The evaluation set (--eval-data) cut into micro-batches by the run's batching settings (the plan of its epoch 0), and
// what those micro-batches hold (examples cut to the budget under --oversize truncate).
struct EvalSet {
  Data data;
  std::vector<packing::BatchPlan> plans;
  std::int64_t tokens = 0;
  std::int64_t targets = 0;
};

EvalSet plan_eval_set(TrainConfig const& c, std::int64_t vocab_size, packing::PackerOptions const& options,
                      packing::Progress const* progress);

// Whether the run evaluates after step `step` (0-based): after every eval_every steps and after the last.
bool evaluates_after(TrainConfig const& c, std::int64_t step);

}  // namespace fusepack::train
