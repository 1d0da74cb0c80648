// Small text helpers for messages, shared by every layer (no torch here).
#pragma once

#include <string>

namespace fusepack::packing {

// "[2, 3, 4]": a shape for an error message, from any sequence of integers (std::vector, at::IntArrayRef, ...).
template <typename Ints>
std::string shape_str(Ints const& shape) {
  std::string s = "[";
  bool first = true;
  for (auto const d : shape) {
    s += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return s + "]";
}

}  // namespace fusepack::packing
