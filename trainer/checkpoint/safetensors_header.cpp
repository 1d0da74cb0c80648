#include "trainer/checkpoint/safetensors_header.h"

#include "packing/text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <limits>
#include <stdexcept>
#include <tuple>

namespace fusepack::checkpoint {
namespace {

using nlohmann::json;

using packing::shape_str;

std::string describe(json const& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s + " (" + v.type_name() + ")";
}

std::string in_quotes(std::string const& name) { return "'" + name + "'"; }

[[noreturn]] void fail(std::string const& path, std::string const& what) {
  throw std::runtime_error("safetensors " + path + ": " + what);
}

[[noreturn]] void fail_tensor(std::string const& path, std::string const& name, std::string const& what) {
  fail(path, "tensor " + in_quotes(name) + ": " + what);
}

[[noreturn]] void index_fail(std::string const& path, std::string const& what) {
  throw std::runtime_error("checkpoint index " + path + ": " + what);
}

SafetensorsDtype const* find_dtype(std::string const& name) {
  for (auto const& d : kSafetensorsDtypes) {
    if (name == dtype_name(d)) return &d;
  }
  return nullptr;
}

// The deepest nesting of arrays and objects accepted (headers and indexes nest 3 levels): nlohmann's dump() recurses
// once per level, and describe() dumps what it reports, so a header nesting 60,000 arrays overflowed the stack.
constexpr int kMaxJsonDepth = 64;

// nlohmann keeps the last of two equal keys silently; the safetensors format disallows duplicates, so they are
// caught while parsing, at every level. `where` starts every error message ("safetensors <path>: header").
json parse_json(std::string const& text, std::string const& where) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  json::parser_callback_t const cb = [&](int depth, json::parse_event_t event, json& parsed) {
    bool const opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    if (opens && depth >= kMaxJsonDepth) {
      throw std::runtime_error(where + " nests arrays and objects more than " + std::to_string(kMaxJsonDepth) +
                               " levels deep");
    }
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty()) {
      std::string const key = parsed.get<std::string>();
      if (!keys.back().insert(key).second) {
        throw std::runtime_error(where + " has the key " + in_quotes(key) + " twice");
      }
    }
    return true;
  };
  try {
    return json::parse(text, cb);
  } catch (json::parse_error const& e) {
    std::string const msg = e.what();
    std::size_t const colon = msg.find(": ");
    throw std::runtime_error(where + " is not valid JSON (at byte " + std::to_string(e.byte) +
                             "): " + (colon == std::string::npos ? msg : msg.substr(colon + 2)));
  } catch (json::out_of_range const& e) {
    // A number beyond double's range ("1e400"): nlohmann reports it as out_of_range, not parse_error.
    std::string const msg = e.what();
    std::size_t const tag = msg.find("] ");
    throw std::runtime_error(where + " is not valid JSON: " + (tag == std::string::npos ? msg : msg.substr(tag + 2)));
  }
}

// A non-negative JSON integer that fits in int64, or an error naming `field`.
std::int64_t non_negative(json const& v, std::string const& path, std::string const& name, std::string const& field) {
  if (v.is_number_unsigned()) {
    if (v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail_tensor(path, name, field + " " + v.dump() + " is too large");
    }
    return static_cast<std::int64_t>(v.get<std::uint64_t>());
  }
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return v.get<std::int64_t>();
  fail_tensor(path, name, field + " must be a non-negative integer; got " + describe(v));
}

HeaderEntry parse_entry(std::string const& path, std::string const& name, json const& entry, std::int64_t buffer) {
  if (!entry.is_object()) {
    fail_tensor(path, name, "entry must be an object {dtype, shape, data_offsets}; got " + describe(entry));
  }
  HeaderEntry info;
  info.name = name;
  auto const field = [&](char const* key) -> json const& {
    auto const it = entry.find(key);
    if (it == entry.end()) fail_tensor(path, name, std::string("has no \"") + key + "\"");
    return *it;
  };

  json const& dtype = field("dtype");
  if (!dtype.is_string()) fail_tensor(path, name, "dtype must be a string; got " + describe(dtype));
  SafetensorsDtype const* d = find_dtype(dtype.get<std::string>());
  if (d == nullptr) {
    fail_tensor(path, name, "unknown dtype " + dtype.dump() + " (supported: " + supported_safetensors_dtypes() + ")");
  }
  info.dtype = *d;

  json const& shape = field("shape");
  if (!shape.is_array()) fail_tensor(path, name, "shape must be an array of integers; got " + describe(shape));
  for (std::size_t i = 0; i < shape.size(); ++i) {
    info.shape.push_back(non_negative(shape[i], path, name, "shape[" + std::to_string(i) + "]"));
  }
  std::int64_t const expected = safetensors_byte_count(info.shape, element_size(*d));
  if (expected < 0) fail_tensor(path, name, "shape " + shape_str(info.shape) + " holds more bytes than int64 counts");

  json const& offsets = field("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    fail_tensor(path, name, "data_offsets must be [begin, end]; got " + describe(offsets));
  }
  info.begin = non_negative(offsets[0], path, name, "data_offsets[0]");
  info.end = non_negative(offsets[1], path, name, "data_offsets[1]");
  std::string const range = "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
  if (info.end < info.begin) fail_tensor(path, name, range + " end before begin");
  if (info.end > buffer) {
    fail_tensor(path, name, range + " reach past the end of the data buffer: expected end <= " +
                                std::to_string(buffer) + " (the buffer's size in bytes), got " +
                                std::to_string(info.end));
  }
  if (info.end - info.begin != expected) {
    fail_tensor(path, name, range + " do not match shape " + shape_str(info.shape) + " of " + dtype_name(*d) +
                                ": expected " + std::to_string(expected) + " bytes, got " +
                                std::to_string(info.end - info.begin));
  }
  return info;
}

std::string metadata_value(json const& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

char const* dtype_name(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF64: return "F64";
    case SafetensorsDtype::kF32: return "F32";
    case SafetensorsDtype::kF16: return "F16";
    case SafetensorsDtype::kBF16: return "BF16";
    case SafetensorsDtype::kI64: return "I64";
    case SafetensorsDtype::kI32: return "I32";
    case SafetensorsDtype::kI16: return "I16";
    case SafetensorsDtype::kI8: return "I8";
    case SafetensorsDtype::kU8: return "U8";
    case SafetensorsDtype::kBool: return "BOOL";
  }
  throw std::invalid_argument("dtype_name: not a SafetensorsDtype");
}

std::int64_t element_size(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF64: case SafetensorsDtype::kI64: return 8;
    case SafetensorsDtype::kF32: case SafetensorsDtype::kI32: return 4;
    case SafetensorsDtype::kF16: case SafetensorsDtype::kBF16: case SafetensorsDtype::kI16: return 2;
    case SafetensorsDtype::kI8: case SafetensorsDtype::kU8: case SafetensorsDtype::kBool: return 1;
  }
  throw std::invalid_argument("element_size: not a SafetensorsDtype");
}

std::string supported_safetensors_dtypes() {
  std::string s;
  for (auto const& d : kSafetensorsDtypes) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
  return s;
}

std::int64_t safetensors_byte_count(std::vector<std::int64_t> const& shape, std::int64_t element_size) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::int64_t bytes = element_size;
  for (std::int64_t const dim : shape) {
    if (bytes > std::numeric_limits<std::int64_t>::max() / dim) return -1;
    bytes *= dim;
  }
  return bytes;
}

std::uint64_t safetensors_header_length(std::string const& path, unsigned char const (&length_bytes)[8],
                                        std::int64_t file_size, std::int64_t max_header_bytes) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length_bytes[i];
  if (n > static_cast<std::uint64_t>(file_size - 8)) {
    fail(path, "header length " + std::to_string(n) + " is larger than the file allows: expected at most " +
                   std::to_string(file_size - 8) + " (file size " + std::to_string(file_size) + " minus 8)");
  }
  if (n > static_cast<std::uint64_t>(max_header_bytes)) {
    fail(path, "header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(max_header_bytes) +
                   " bytes");
  }
  return n;
}

ParsedHeader parse_safetensors_header(std::string const& path, std::string const& text, std::int64_t file_size) {
  if (text.empty() || text[0] != '{') {
    unsigned char const first = text.empty() ? 0 : static_cast<unsigned char>(text[0]);
    fail(path, "header must be a JSON object starting with '{'; got " +
                   (text.empty() ? std::string("an empty header")
                                 : "byte " + std::to_string(+first) + " ('" +
                                       (std::isprint(first) ? text.substr(0, 1) : "?") + "')"));
  }
  json const doc = parse_json(text, "safetensors " + path + ": header");
  if (!doc.is_object()) fail(path, "header must be a JSON object; got " + describe(doc));

  ParsedHeader header;
  header.data_start = 8 + static_cast<std::int64_t>(text.size());
  std::int64_t const buffer = file_size - header.data_start;
  for (auto const& [name, entry] : doc.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__ must be an object of strings; got " + describe(entry));
      for (auto const& [k, v] : entry.items()) {
        if (!v.is_string()) fail(path, "__metadata__[" + in_quotes(k) + "] must be a string; got " + describe(v));
        header.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    header.tensors.push_back(parse_entry(path, name, entry, buffer));
  }

  std::sort(header.tensors.begin(), header.tensors.end(), [](HeaderEntry const& a, HeaderEntry const& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::int64_t covered = 0;
  std::string previous;
  for (HeaderEntry const& info : header.tensors) {
    std::string const range = "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
    if (info.begin < covered) {
      fail_tensor(path, info.name, range + " overlap tensor " + in_quotes(previous) + ", which ends at " +
                                       std::to_string(covered) + ": expected begin " + std::to_string(covered) +
                                       ", got " + std::to_string(info.begin));
    }
    if (info.begin > covered) {
      fail_tensor(path, info.name, range + " leave bytes [" + std::to_string(covered) + ", " +
                                       std::to_string(info.begin) + ") of the buffer to no tensor: expected begin " +
                                       std::to_string(covered) + ", got " + std::to_string(info.begin));
    }
    covered = info.end;
    previous = info.name;
  }
  if (covered != buffer) {
    fail(path, "the tensors cover " + std::to_string(covered) + " bytes of the data buffer, but the file holds " +
                   std::to_string(buffer) + " after the header: expected the tensors to cover all of it");
  }
  return header;
}

ParsedIndex parse_safetensors_index(std::string const& path, std::string const& text) {
  json const doc = parse_json(text, "checkpoint index " + path);
  if (!doc.is_object()) index_fail(path, "must be a JSON object {metadata, weight_map}; got " + describe(doc));
  auto const map_it = doc.find("weight_map");
  if (map_it == doc.end() || !map_it->is_object()) {
    index_fail(path, "needs \"weight_map\": {tensor name: shard file}; got " +
                         (map_it == doc.end() ? std::string("none") : describe(*map_it)));
  }

  ParsedIndex out;
  auto const meta_it = doc.find("metadata");
  if (meta_it != doc.end()) {
    if (!meta_it->is_object()) index_fail(path, "\"metadata\" must be an object; got " + describe(*meta_it));
    for (auto const& [k, v] : meta_it->items()) out.metadata[k] = metadata_value(v);
  }

  for (auto const& [name, file] : map_it->items()) {
    if (!file.is_string()) {
      index_fail(path, "weight_map[" + in_quotes(name) + "] must be a shard file name; got " + describe(file));
    }
    std::string const f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      index_fail(path, "weight_map[" + in_quotes(name) + "] is " + in_quotes(f) +
                 ", not the name of a file in the index's folder");
    }
    out.weight_map[name] = f;
    out.shards[f].insert(name);
  }
  return out;
}

}  // namespace fusepack::checkpoint
