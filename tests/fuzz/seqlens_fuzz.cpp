// Fuzzes a --seqlens list: CLI11's comma-delimited std::vector<int> option, as fusepack-gradcheck declares it, and
// cu_seqlens_from_lengths (verify/random.h), which turns the list into a packed batch's offsets. Each input line
// is one argument after "--seqlens". CLI::ParseError (exit code 2 in the tool) and std::invalid_argument are the
// answers to bad input.
#include "verify/random.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::vector<std::string> args{"fusepack-gradcheck", "--seqlens"};
  std::string const text(reinterpret_cast<char const*>(data), size);
  for (std::size_t pos = 0; pos <= text.size();) {
    std::size_t const end = std::min(text.find('\n', pos), text.size());
    args.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());

  std::vector<int> seqlens{1, 17, 300};
  CLI::App app{"fusepack-gradcheck"};
  app.add_option("--seqlens", seqlens, "example lengths of the packed batch, e.g. 1,17,1024")
      ->delimiter(',')
      ->capture_default_str();
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (CLI::ParseError const&) {
    return 0;
  }
  std::vector<std::int32_t> cu;
  try {
    cu = fusepack::verify::cu_seqlens_from_lengths(seqlens);
  } catch (std::invalid_argument const&) {
    return 0;
  }
  if (cu.size() != seqlens.size() + 1 || cu[0] != 0) {
    std::fprintf(stderr, "seqlens_fuzz: %zu lengths gave %zu offsets\n", seqlens.size(), cu.size());
    std::abort();
  }
  return 0;
}
