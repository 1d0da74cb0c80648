// The run's golden check (fusepack-train --golden-check, --golden-baseline): the golden and the baseline read and
// checked before the first step, the run's steps compared with them after the last. No torch.
#pragma once

#include "golden/compare.h"
#include "golden/golden_file.h"
#include "trainer/train/config.h"

#include <optional>
#include <string>
#include <vector>

namespace fusepack::train {

// What differs between a golden's provenance and a run's beyond the batch layout and backend (model config, dataset,
// seed, the rest of the batching and the optimizer): one sentence each; empty when the run repeats the golden's
// settings. run_training prints them as notes before a golden check.
std::vector<std::string> provenance_differences(golden::Provenance const& golden, golden::Provenance const& run);

class GoldenCheck {
 public:
  // Reads c.golden_check and, when given, c.golden_baseline: the golden's own run repeated in the run's dtype, whose
  // drift from the golden sets the allowance (anything else is refused, naming what differs). Without a baseline the
  // tolerance is `tolerance`, or golden::derived_tolerance of the run's and the golden's dtypes; explicit tolerances
  // and a baseline exclude each other.
  GoldenCheck(TrainConfig const& c, std::optional<golden::TolerancePolicy> const& tolerance);

  golden::GoldenFile const& reference() const { return reference_; }
  bool has_baseline() const { return baseline_.has_value(); }
  // The run's steps against the golden: within 2x the baseline's drift plus one rounding step of the run's dtype, or
  // within the tolerance.
  golden::Comparison compare(std::vector<golden::StepRecord> const& run) const;

 private:
  DType dtype_;
  golden::GoldenFile reference_;
  std::optional<golden::GoldenFile> baseline_;
  golden::TolerancePolicy tolerance_;
};

}  // namespace fusepack::train
