// Fuzzes the Qwen3.5 config.json reader (trainer/model/config.h, torch-free). std::invalid_argument is its answer to
// a bad config; an accepted config must write (to_json) text that reads back to an equal config.
#include "trainer/model/config.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace {

[[noreturn]] void broken(std::string const& what) {
  std::fprintf(stderr, "model_config_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  using fusepack::model::Qwen35Config;
  std::string const text(reinterpret_cast<char const*>(data), size);
  Qwen35Config config;
  try {
    config = Qwen35Config::from_json(text);
  } catch (std::invalid_argument const&) {
    return 0;
  }
  std::string const written = config.to_json();
  try {
    if (Qwen35Config::from_json(written) != config) broken("to_json() reads back differently:\n" + written);
  } catch (std::invalid_argument const& e) {
    broken(std::string("to_json() of an accepted config is refused: ") + e.what() + "\n" + written);
  }
  return 0;
}
