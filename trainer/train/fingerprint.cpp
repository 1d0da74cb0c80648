#include "trainer/train/fingerprint.h"

#include <nlohmann/json.hpp>

#include <stdexcept>

namespace fusepack::train {

std::vector<SettingDifference> setting_differences(std::string const& first, std::string const& second,
                                                   std::vector<std::string> const& ignore) {
  using Json = nlohmann::ordered_json;
  Json a, b;
  try {
    a = Json::parse(first);
    b = Json::parse(second);
  } catch (Json::parse_error const& e) {
    throw std::invalid_argument(std::string("setting_differences: a fingerprint is not JSON: ") + e.what());
  }
  for (std::string const& key : ignore) {
    a.erase(key);
    b.erase(key);
  }
  std::vector<SettingDifference> out;
  if (a == b) return out;
  auto value = [](Json const& j, Json::json_pointer const& p) { return j.contains(p) ? j[p].dump() : "(absent)"; };
  for (Json const& op : Json::diff(a, b)) {
    std::string const path = op.value("path", "");
    Json::json_pointer const pointer(path);
    out.push_back({path, value(a, pointer), value(b, pointer)});
  }
  return out;
}

}  // namespace fusepack::train
