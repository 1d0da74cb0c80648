// Fuzzes the safetensors header reader (trainer/checkpoint/safetensors_header.h) with each input as a whole file: the
// 8-byte little-endian length, the JSON header, the data buffer. std::runtime_error is its answer to a bad file; an
// accepted header must tile the buffer exactly, as read_safetensors then relies on.
#include "trainer/checkpoint/safetensors_header.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace {

// safetensors.h's kMaxHeaderBytes (that header includes ATen, which this target does not link).
constexpr std::int64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void broken(std::string const& what) {
  std::fprintf(stderr, "safetensors_header_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  using namespace fusepack::checkpoint;
  if (size < 8) return 0;  // read_safetensors_header refuses such a file before reading the length
  unsigned char length[8];
  std::memcpy(length, data, 8);
  auto const file_size = static_cast<std::int64_t>(size);
  ParsedHeader header;
  try {
    std::uint64_t const n = safetensors_header_length("fuzz.safetensors", length, file_size, kMaxHeaderBytes);
    std::string const text(reinterpret_cast<char const*>(data) + 8, n);
    header = parse_safetensors_header("fuzz.safetensors", text, file_size);
  } catch (std::runtime_error const&) {
    return 0;
  }
  std::int64_t covered = 0;
  for (HeaderEntry const& e : header.tensors) {
    if (e.begin != covered || e.end < e.begin) broken("tensor '" + e.name + "' does not follow the one before");
    if (e.end - e.begin != safetensors_byte_count(e.shape, element_size(e.dtype))) {
      broken("tensor '" + e.name + "' has a byte range that does not match its shape");
    }
    covered = e.end;
  }
  if (header.data_start + covered != file_size) broken("the tensors do not end where the file ends");
  return 0;
}
