// Fuzzes the JSONL dataset reader (packing/dataset.h) over one input as a whole file. DatasetError and
// std::invalid_argument are its answers to bad input; an accepted dataset must pass check_example and survive a
// write_jsonl/read_jsonl round trip unchanged. Anything else ends the run.
#include "packing/dataset.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr std::int64_t kVocab = 1 << 17;

std::vector<fusepack::packing::Example> read(std::string const& text, std::string const& name) {
  std::istringstream in(text);
  std::vector<fusepack::packing::Example> out;
  fusepack::packing::read_jsonl(in, name, kVocab,
                                [&](fusepack::packing::Example&& ex) { out.push_back(std::move(ex)); });
  return out;
}

[[noreturn]] void broken(char const* what) {
  std::fprintf(stderr, "jsonl_dataset_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::string const text(reinterpret_cast<char const*>(data), size);
  std::vector<fusepack::packing::Example> examples;
  try {
    examples = read(text, "fuzz.jsonl");
  } catch (fusepack::packing::DatasetError const&) {
    return 0;
  } catch (std::invalid_argument const&) {
    return 0;
  }
  for (auto const& ex : examples) {
    try {
      fusepack::packing::check_example(ex, kVocab, "an example read_jsonl accepted");
    } catch (std::invalid_argument const& e) {
      broken(e.what());
    }
  }
  std::ostringstream out;
  fusepack::packing::write_jsonl(out, examples);
  std::vector<fusepack::packing::Example> again;
  try {
    again = read(out.str(), "round trip");
  } catch (std::exception const& e) {
    broken(e.what());
  }
  if (again.size() != examples.size()) broken("round trip changed the number of examples");
  for (std::size_t i = 0; i < again.size(); ++i) {
    if (again[i].input_ids != examples[i].input_ids || again[i].labels != examples[i].labels) {
      broken("round trip changed an example");
    }
  }
  return 0;
}
