#include "trainer/train/golden_check.h"

#include "trainer/train/fingerprint.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <stdexcept>

namespace fusepack::train {
namespace {

using Json = nlohmann::ordered_json;

// One rounding step of a run's dtype, relative (its unit roundoff: half an ulp at 1).
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return std::ldexp(1.0, -53);
    case DType::kFloat32: return std::ldexp(1.0, -24);
    case DType::kBFloat16: return std::ldexp(1.0, -8);
  }
  return 0;
}

// How far the baseline of a golden check may itself be from the fp64 golden, relative, at any step: a fixed budget, so
// that a less accurate baseline cannot loosen the allowance it sets. Measured on the golden settings (qwen35-tiny and
// qwen35-tiny64, 10 steps): the bf16 composite reaches 0.36 of one bf16 rounding step (its grad norm), the fp32 one
// 2.7 fp32 steps (its grad norm at step 9; fp32 rounds less, so its many ops add up to more steps). The budgets leave
// about 3x of that.
double baseline_budget(DType dtype) {
  return (dtype == DType::kFloat32 ? 8 : 1) * unit_roundoff(dtype);
}

// The baseline of a golden check: the golden's own run (same model, data, seed, batching, optimizer) in this run's
// dtype; anything else would make its drift meaningless as an allowance.
golden::GoldenFile read_baseline(TrainConfig const& config, golden::GoldenFile const& reference) {
  golden::GoldenFile b = golden::read_golden(config.golden_baseline);
  std::string const where = "golden baseline " + config.golden_baseline + ": ";
  if (b.provenance.dtype != golden_dtype_name(config.dtype)) {
    throw std::invalid_argument(where + "its dtype is " + b.provenance.dtype + " but this run's is " +
                                golden_dtype_name(config.dtype) + "; the baseline must be repeated in the run's dtype");
  }
  std::vector<std::string> differences = provenance_differences(reference.provenance, b.provenance);
  if (Json::parse(reference.provenance.batching).value("layout", "") != Json::parse(b.provenance.batching).value("layout", "")) {
    differences.push_back("the layouts differ (the baseline repeats the golden's own layout)");
  }
  if (!differences.empty()) {
    std::string why;
    for (std::string const& d : differences) why += (why.empty() ? "" : "; ") + d;
    throw std::invalid_argument(where + "it is not a rerun of the golden " + config.golden_check + ": " + why);
  }
  return b;
}

}  // namespace

std::vector<std::string> provenance_differences(golden::Provenance const& golden, golden::Provenance const& run) {
  std::vector<std::string> notes;
  if (Json::parse(golden.model_config) != Json::parse(run.model_config)) notes.push_back("the model configs differ");
  // One note per differing setting, named by its JSON pointer: short lines, not two whole JSON objects.
  auto each_difference = [&notes](std::string const& what, std::string const& a, std::string const& b,
                                  std::vector<std::string> const& ignore) {
    for (SettingDifference const& d : setting_differences(a, b, ignore)) {
      notes.push_back(what + ": " + d.path + " " + d.first + " in the golden, " + d.second + " in the run");
    }
  };
  each_difference("the datasets differ", golden.dataset, run.dataset, {});
  if (golden.seed != run.seed) {
    notes.push_back("the seeds differ: golden " + std::to_string(golden.seed) + ", run " + std::to_string(run.seed));
  }
  each_difference("the batching differs beyond the layout", golden.batching, run.batching, {"layout", "backend"});
  return notes;
}

GoldenCheck::GoldenCheck(TrainConfig const& c, std::optional<golden::TolerancePolicy> const& tolerance)
    : dtype_(c.dtype), reference_(golden::read_golden(c.golden_check)) {
  if (!c.golden_baseline.empty()) {
    if (tolerance) throw std::invalid_argument("a golden baseline and explicit tolerances exclude each other");
    baseline_ = read_baseline(c, reference_);
  } else {
    tolerance_ = tolerance ? *tolerance
                           : golden::derived_tolerance(golden_dtype_name(c.dtype), reference_.provenance.dtype);
    tolerance_.validate();
  }
}

golden::Comparison GoldenCheck::compare(std::vector<golden::StepRecord> const& run) const {
  return baseline_ ? golden::compare_with_baseline(reference_, baseline_->steps, run, unit_roundoff(dtype_),
                                                   baseline_budget(dtype_))
                   : golden::compare(reference_, run, tolerance_);
}

}  // namespace fusepack::train
