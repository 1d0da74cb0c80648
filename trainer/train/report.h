// What a training run prints: one log line per optimizer step (loss, grad norm, lr, tokens/s, padding share), a
// progress bar for terminals and the final summary; and the step's golden record. Plain C++ (no torch).
#pragma once

#include "golden/golden_file.h"
#include "packing/progress.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::train {

// One optimizer step as the run saw it.
struct StepMetrics {
  std::int64_t step = 0;           // 0-based optimizer step
  double loss = 0;                 // Σ CE / targets over the step's micro-batches, before the update
  double grad_norm = 0;            // global gradient L2 norm before clipping
  double lr = 0;                   // learning rate of the update
  std::int64_t targets = 0;        // supervised tokens (labels != -100) of the step
  std::int64_t tokens = 0;         // real input tokens of the step's micro-batches
  std::int64_t slots = 0;          // token positions computed: packed = tokens; padded = Σ rows x longest
  std::int64_t examples = 0;       // examples in the step's micro-batches
  std::int64_t micro_batches = 0;  // micro-batches of the step
  double seconds = 0;              // wall time of the step, from queueing its first forward to the end of the update
                                   // (its batches were built during the step before; it builds the next step's)

  double padding_share() const;      // (slots - tokens) / slots: the share of computed positions that are padding
  double tokens_per_second() const;  // real tokens / seconds (0 when seconds is 0)
  golden::StepRecord record() const;  // {step, loss, grad_norm, tokens = targets, lr}
};

// The mean loss over the whole evaluation set (TrainConfig::eval_data) after an optimizer step's update.
struct EvalMetrics {
  std::int64_t step = 0;           // the 0-based optimizer step after whose update the set was evaluated
  double loss = 0;                 // Σ CE over every eval micro-batch / targets
  std::int64_t targets = 0;        // supervised tokens of the eval set (as cut by the budget)
  std::int64_t tokens = 0;         // real input tokens of the eval set
  std::int64_t examples = 0;
  std::int64_t micro_batches = 0;
  double seconds = 0;              // wall time of the evaluation
};

// "eval    3/10  loss 5.398765  targets 2,990  tokens 3,104  examples 40  1.2 s": its columns line up with the step
// line of the step it follows.
std::string eval_log_line(EvalMetrics const& m, std::int64_t total_steps);

// "step    3/10  loss 5.412345  grad norm 1.2346  lr 3.000e-04  targets 498  tokens 512  1,234 tok/s
// padding 12.3%"
std::string step_log_line(StepMetrics const& m, std::int64_t total_steps);

// "[#######------------]  3/10 steps  1,234 tok/s  eta 5 s", `width` characters of bar.
std::string progress_bar(std::int64_t steps_done, std::int64_t total_steps, double tokens_per_second,
                         double eta_seconds, int width = 30);

struct RunSummary {
  std::int64_t steps = 0;
  std::int64_t targets = 0;   // Σ over steps
  std::int64_t tokens = 0;    // Σ real tokens
  std::int64_t slots = 0;     // Σ computed positions
  std::int64_t examples = 0;  // Σ examples (an example seen in two epochs counts twice)
  double train_seconds = 0;   // Σ step times
  double wall_seconds = 0;    // the whole run: model and data setup, steps, outputs
  double first_loss = 0;      // the first step's loss
  std::int64_t first_step = 0;  // its number (after a resume: the first step after the checkpoint)
  double final_loss = 0;      // the last step's loss

  double padding_share() const;      // (slots - tokens) / slots
  double tokens_per_second() const;  // tokens / train_seconds
};

// Throws std::invalid_argument for no step.
RunSummary summarize(std::vector<StepMetrics> const& steps, double wall_seconds);

// Several lines: "summary: 10 steps, 4,980 targets, 5,120 tokens in 412 examples" / "throughput: 1,234 tokens/s
// (train time 4.1 s, wall time 5.0 s)" / "padding: 12.3% of 5,840 computed positions" / "loss: 5.4123 (step 0) ->
// 3.2101 (step 9)".
std::string summary_text(RunSummary const& s);

// 1234567 -> "1,234,567" (packing/progress.h).
using packing::grouped;

}  // namespace fusepack::train
