// The JSON half of safetensors checkpoints, without torch: a file's header (the text after its 8-byte length) and a
// sharded folder's model.safetensors.index.json, each validated in full. safetensors.cpp reads the files, maps the
// dtypes to ATen and checks the shards against the index; the error messages are the ones safetensors.h documents.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fusepack::checkpoint {

// The dtypes safetensors files hold here.
enum class SafetensorsDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };
inline constexpr SafetensorsDtype kSafetensorsDtypes[] = {
    SafetensorsDtype::kF64, SafetensorsDtype::kF32, SafetensorsDtype::kF16, SafetensorsDtype::kBF16,
    SafetensorsDtype::kI64, SafetensorsDtype::kI32, SafetensorsDtype::kI16, SafetensorsDtype::kI8,
    SafetensorsDtype::kU8,  SafetensorsDtype::kBool,
};
char const* dtype_name(SafetensorsDtype dtype);      // "F64", ..., "BOOL"
std::int64_t element_size(SafetensorsDtype dtype);   // bytes per element
std::string supported_safetensors_dtypes();          // "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL"

// numel × element_size of a shape of non-negative dimensions, or -1 when that does not fit in int64.
std::int64_t safetensors_byte_count(std::vector<std::int64_t> const& shape, std::int64_t element_size);

// One tensor as a header describes it.
struct HeaderEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<std::int64_t> shape;  // [] for a 0-dim tensor; a 0 anywhere for an empty one (no bytes)
  std::int64_t begin = 0;           // byte range [begin, end) in the buffer that follows the header
  std::int64_t end = 0;
};

struct ParsedHeader {
  std::vector<HeaderEntry> tensors;             // ascending begin
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
  std::int64_t data_start = 0;                  // file offset of the buffer: 8 + N
};

// N from a file's first 8 bytes (little-endian), checked against the file's size and max_header_bytes. `path` names
// the file in errors: std::runtime_error "safetensors <path>: header length ...".
std::uint64_t safetensors_header_length(std::string const& path, unsigned char const (&length_bytes)[8],
                                        std::int64_t file_size, std::int64_t max_header_bytes);

// The N-byte header `text` of a file of `file_size` bytes: a JSON object without duplicate keys; every entry has a
// known dtype, a shape of non-negative integers and data_offsets whose length is numel × element size; the entries
// tile the buffer exactly. Throws std::runtime_error "safetensors <path>: [tensor '<name>': ]<problem>".
ParsedHeader parse_safetensors_header(std::string const& path, std::string const& text, std::int64_t file_size);

struct ParsedIndex {
  std::map<std::string, std::string> metadata;          // "metadata", non-strings as JSON text
  std::map<std::string, std::string> weight_map;        // tensor name → shard file
  std::map<std::string, std::set<std::string>> shards;  // shard file → the tensors weight_map puts there
};

// An index's text: a JSON object without duplicate keys, "weight_map" an object of shard file names (plain names in
// the index's folder), "metadata" an object when present. Throws std::runtime_error "checkpoint index <path>: ...".
ParsedIndex parse_safetensors_index(std::string const& path, std::string const& text);

}  // namespace fusepack::checkpoint
