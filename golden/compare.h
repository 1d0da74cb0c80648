// The golden comparator: a run's step records against a golden file's, step by step, under a tolerance policy.
// Token counts must match exactly (the packed and padded paths must supervise the same targets); loss, grad_norm
// and lr within atol + rtol·|golden| + drift_per_step·step (or, for low-precision runs, within the drift of a baseline
// run: compare_with_baseline). A missing or extra step is a failure.
#pragma once

#include "golden/golden_file.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::golden {

// allowed(golden, step) = atol + rtol·|golden| + drift_per_step·step. The default (all 0) demands equality.
struct FieldTolerance {
  double atol = 0;
  double rtol = 0;
  double drift_per_step = 0;  // for runs that drift apart step after step (low precision): allowance grows linearly

  double allowed(double golden, std::int64_t step) const;
};

// One tolerance per compared value; every caller sets and justifies its own (there is no "loose" default).
struct TolerancePolicy {
  FieldTolerance loss;
  FieldTolerance grad_norm;
  FieldTolerance lr;

  void validate() const;  // throws std::invalid_argument: every number finite and >= 0
};

// One compared value of one step.
struct FieldCheck {
  std::int64_t step = 0;
  std::string field;  // "tokens", "loss", "grad_norm" or "lr"
  double golden = 0;
  double run = 0;
  double diff = 0;     // |run − golden| (NaN when run is NaN: fails)
  double allowed = 0;  // 0 for tokens (exact)
  bool pass = false;
};

struct Comparison {
  std::vector<FieldCheck> checks;     // step-major; per step: tokens, loss, grad_norm, lr
  std::vector<std::string> problems;  // failures that are not a value: missing/extra steps, misnumbered steps

  bool passed() const;
  FieldCheck const* first_failure() const;  // nullptr when every check passed
  // "PASS: 40 checks over 10 steps within tolerance" or "FAIL: <why>", naming the first failing step and field.
  std::string verdict() const;
  // step | field | golden | run | |diff| | allowed | PASS/FAIL, one line per check, then the problems and verdict.
  std::string table() const;
};

// The tolerances fusepack derives for a run in `run_dtype` against a golden in `golden_dtype` (provenance dtype names:
// "float64", "float32"), with their derivation in compare.cpp: fp64 against fp64 and fp32 against fp64. Throws
// std::invalid_argument for any other pair (a low-precision run is judged against a baseline instead).
TolerancePolicy derived_tolerance(std::string const& run_dtype, std::string const& golden_dtype);

// Compares run[k] with golden.steps[k] for every k both have. A record whose step number differs from the golden's
// is a problem (its values are not compared: they belong to different steps). Run values are not validated:
// a NaN loss is a failing check, not an exception. Throws std::invalid_argument for a bad policy.
Comparison compare(GoldenFile const& golden, std::vector<StepRecord> const& run, TolerancePolicy const& policy);

// The low-precision rule of golden/FORMAT.md, for runs in a low-precision dtype against a golden of higher
// precision: step k's loss and grad_norm pass when
//   |run − golden| <= 2·|baseline − golden| + floor_rel·|golden|,
// where `baseline` is the golden's own run (same model, data, seed, padded composite) repeated in the run's dtype,
// i.e. the drift users accept today, and floor_rel is one rounding step of that dtype (its unit roundoff). Tokens and
// lr must match exactly. The baseline is first held to a fixed budget of its own: |baseline − golden| <=
// baseline_limit_rel·|golden| at every step (loss and grad_norm), or the comparison fails with a problem naming the
// step, since the allowance is only as tight as the baseline is accurate. Throws std::invalid_argument for a negative or non-finite floor and for a baseline that does
// not repeat the golden (fewer records than compared, other step numbers or target counts, a non-finite value).
Comparison compare_with_baseline(GoldenFile const& golden, std::vector<StepRecord> const& baseline,
                                 std::vector<StepRecord> const& run, double floor_rel, double baseline_limit_rel);

}  // namespace fusepack::golden
