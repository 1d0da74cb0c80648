// Fuzzes the sharded checkpoint index reader (model.safetensors.index.json, trainer/checkpoint/safetensors_header.h).
// std::runtime_error is its answer to a bad index; an accepted one must name only plain files of its folder.
#include "trainer/checkpoint/safetensors_header.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  using namespace fusepack::checkpoint;
  std::string const text(reinterpret_cast<char const*>(data), size);
  ParsedIndex index;
  try {
    index = parse_safetensors_index("fuzz/model.safetensors.index.json", text);
  } catch (std::runtime_error const&) {
    return 0;
  }
  std::size_t listed = 0;
  for (auto const& [file, names] : index.shards) {
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      std::fprintf(stderr, "safetensors_index_fuzz: shard '%s' is not a plain file name\n", file.c_str());
      std::abort();
    }
    listed += names.size();
  }
  if (listed != index.weight_map.size()) {
    std::fprintf(stderr, "safetensors_index_fuzz: shards list %zu tensors, weight_map %zu\n", listed,
                 index.weight_map.size());
    std::abort();
  }
  return 0;
}
