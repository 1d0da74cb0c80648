// Fuzzes the synthetic dataset spec ("synthetic:n=...,median=...", packing/synthetic.h). std::invalid_argument is its
// answer to a bad spec; an accepted spec must print (str()) to text that parses back to the same spec.
#include "packing/synthetic.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace {

bool same(fusepack::packing::SyntheticSpec const& a, fusepack::packing::SyntheticSpec const& b) {
  return a.num_examples == b.num_examples && a.vocab_size == b.vocab_size && a.median_length == b.median_length &&
         a.sigma == b.sigma && a.min_length == b.min_length && a.max_length == b.max_length &&
         a.prompt_fraction == b.prompt_fraction && a.seed == b.seed;
}

[[noreturn]] void broken(std::string const& what) {
  std::fprintf(stderr, "synthetic_spec_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::string const text(reinterpret_cast<char const*>(data), size);
  fusepack::packing::SyntheticSpec spec;
  try {
    spec = fusepack::packing::parse_synthetic_spec(text);
  } catch (std::invalid_argument const&) {
    return 0;
  }
  std::string const printed = spec.str();
  try {
    if (!same(fusepack::packing::parse_synthetic_spec(printed), spec)) broken("'" + printed + "' parses differently");
  } catch (std::invalid_argument const& e) {
    broken("'" + printed + "' (str() of an accepted spec) is refused: " + e.what());
  }
  return 0;
}
