// A run's metrics as JSON Lines, to plot and to compare runs: a first line {"run": {...}} with the run's settings (the
// golden provenance's fields), one line per optimizer step ({"step": 3, "loss": ..., "grad_norm": ..., "lr": ...,
// "targets": ..., "tokens": ..., "examples": ..., "padding": ..., "seconds": ..., "tokens_per_second": ...,
// "device_gib": ...}), with an evaluation run (--eval-data) a line {"eval": {"step": 9, "loss": ..., "targets": ...,
// "tokens": ..., "examples": ..., "micro_batches": ..., "seconds": ...}} after the step it follows, and a last line
// {"summary": {...}}. Rank 0 writes it as the run goes, one flushed line per step, so a run that dies leaves the steps
// it finished; a resumed run appends its steps to the file of the run it resumes.
#pragma once

#include "trainer/train/report.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace fusepack::train {

class MetricsFile {
 public:
  // Creates `path` (or, when `append`, adds to it) and writes the run line; `run_json` is a JSON object. Throws
  // std::runtime_error naming the path when it cannot be opened.
  MetricsFile(std::string path, std::string const& run_json, bool append);

  // device_bytes: the GPU memory allocated at the end of the step; -1 leaves the field out (a CPU run).
  void step(StepMetrics const& m, std::int64_t device_bytes = -1);
  void eval(EvalMetrics const& m);
  void summary(RunSummary const& s);
  std::string const& path() const { return path_; }

 private:
  void line(std::string const& json);

  std::string path_;
  std::ofstream out_;
};

// The step lines of a metrics file in order (the fields StepMetrics has; padding and throughput are recomputed from
// them). Throws std::runtime_error naming the file and line for anything that is not a metrics file.
std::vector<StepMetrics> read_metrics_steps(std::string const& path);
// The eval lines of a metrics file in order; the same errors.
std::vector<EvalMetrics> read_metrics_evals(std::string const& path);

}  // namespace fusepack::train
