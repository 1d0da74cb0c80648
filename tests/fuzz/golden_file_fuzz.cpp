// Fuzzes the golden file reader (golden/golden_file.h). GoldenError is its answer to a bad file; an accepted file must
// write (write_golden) text that reads back and writes again to the same text.
#include "golden/golden_file.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace {

[[noreturn]] void broken(std::string const& what) {
  std::fprintf(stderr, "golden_file_fuzz: %s\n", what.c_str());
  std::abort();
}

std::string written(fusepack::golden::GoldenFile const& file) {
  std::ostringstream out;
  fusepack::golden::write_golden(out, file, "fuzz.json");
  return out.str();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  using fusepack::golden::GoldenError;
  std::istringstream in(std::string(reinterpret_cast<char const*>(data), size));
  fusepack::golden::GoldenFile file;
  try {
    file = fusepack::golden::read_golden(in, "fuzz.json");
  } catch (GoldenError const&) {
    return 0;
  }
  std::string first, second;
  try {
    first = written(file);
    std::istringstream again(first);
    second = written(fusepack::golden::read_golden(again, "round trip"));
  } catch (GoldenError const& e) {
    broken(std::string("an accepted file does not round-trip: ") + e.what());
  }
  if (first != second) broken("write/read/write changed the text:\n" + first + "\n---\n" + second);
  return 0;
}
