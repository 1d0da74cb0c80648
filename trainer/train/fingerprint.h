// A run's settings fingerprint (a JSON object: model, data, batching, optimizer, numerics) compared setting by setting:
// between the ranks of one run before it starts, and between a run and the checkpoint it resumes. No torch here.
#pragma once

#include <string>
#include <vector>

namespace fusepack::train {

// One setting two fingerprints disagree on: its JSON pointer ("/batching/optimizer/lr") and each side's value as JSON
// text, "(absent)" where a side lacks it.
struct SettingDifference {
  std::string path;
  std::string first;
  std::string second;
};

// Every setting in which `first` and `second` (JSON text) differ, top-level keys in `ignore` left out. Throws
// std::invalid_argument when either is not JSON.
std::vector<SettingDifference> setting_differences(std::string const& first, std::string const& second,
                                                   std::vector<std::string> const& ignore = {});

}  // namespace fusepack::train
