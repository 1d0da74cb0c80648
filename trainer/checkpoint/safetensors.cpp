#include "trainer/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <dirent.h>
#include <sys/stat.h>
#include <sys/types.h>

namespace fusepack::checkpoint {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// Files and folders through POSIX, not std::filesystem: libtorch.so (the 2.11 wheel) exports its own copies of the
// std::filesystem functions, a binary linked with it binds to those, and their remove_all crashed on a non-empty folder.
enum class PathKind { kMissing, kFile, kDirectory, kOther };

PathKind path_kind(std::string const& path, std::int64_t* size = nullptr) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return PathKind::kMissing;
  if (size != nullptr) *size = static_cast<std::int64_t>(st.st_size);
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  if (S_ISDIR(st.st_mode)) return PathKind::kDirectory;
  return PathKind::kOther;
}

std::string join(std::string const& dir, std::string const& name) {
  return dir.empty() ? name : dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string parent_dir(std::string const& path) {
  std::size_t const slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// mkdir -p; throws naming the component that could not be made.
void make_dirs(std::string const& dir) {
  for (std::size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string const prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      throw std::runtime_error("checkpoint " + dir + ": cannot create " + prefix + ": " + std::strerror(errno));
    }
  }
  if (path_kind(dir) != PathKind::kDirectory) throw std::runtime_error("checkpoint " + dir + ": not a folder");
}

std::vector<std::string> list_dir(std::string const& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) throw std::runtime_error("checkpoint " + dir + ": cannot list the folder: " + std::strerror(errno));
  while (dirent const* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

struct DtypeEntry {
  char const* name;
  at::ScalarType type;
  std::int64_t size;  // bytes per element
};

constexpr DtypeEntry kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2}, {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};

std::string supported_dtypes() {
  std::string s;
  for (auto const& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

DtypeEntry const* find_dtype(std::string const& name) {
  for (auto const& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

DtypeEntry const* find_dtype(at::ScalarType type) {
  for (auto const& d : kDtypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

template <typename Ints>
std::string shape_str(Ints const& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

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

void require_little_endian() {
  std::uint16_t const one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  if (first != 1) {
    throw std::runtime_error("safetensors data is little-endian and this host is big-endian; fusepack does not "
                             "byte-swap");
  }
}

// nlohmann keeps the last of two equal keys silently; the safetensors format disallows duplicates, so they are
// caught while parsing, at every level. `where` starts every error message ("safetensors <path>: header").
json parse_json(std::string const& text, std::string const& where) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  json::parser_callback_t const cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty()) {
      std::string const key = parsed.get<std::string>();
      if (!keys.back().insert(key).second) throw std::runtime_error(where + " has the key " + in_quotes(key) + " twice");
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

TensorInfo parse_entry(std::string const& path, std::string const& name, json const& entry, std::int64_t buffer) {
  if (!entry.is_object()) {
    fail_tensor(path, name, "entry must be an object {dtype, shape, data_offsets}; got " + describe(entry));
  }
  TensorInfo info;
  info.name = name;
  auto const field = [&](char const* key) -> json const& {
    auto const it = entry.find(key);
    if (it == entry.end()) fail_tensor(path, name, std::string("has no \"") + key + "\"");
    return *it;
  };

  json const& dtype = field("dtype");
  if (!dtype.is_string()) fail_tensor(path, name, "dtype must be a string; got " + describe(dtype));
  DtypeEntry const* d = find_dtype(dtype.get<std::string>());
  if (d == nullptr) {
    fail_tensor(path, name, "unknown dtype " + dtype.dump() + " (supported: " + supported_dtypes() + ")");
  }
  info.dtype = d->type;

  json const& shape = field("shape");
  if (!shape.is_array()) fail_tensor(path, name, "shape must be an array of integers; got " + describe(shape));
  for (std::size_t i = 0; i < shape.size(); ++i) {
    info.shape.push_back(non_negative(shape[i], path, name, "shape[" + std::to_string(i) + "]"));
  }
  std::int64_t numel = 1;
  if (std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end()) {
    numel = 0;
  } else {
    for (std::int64_t const dim : info.shape) {
      if (numel > std::numeric_limits<std::int64_t>::max() / d->size / dim) {
        fail_tensor(path, name, "shape " + shape_str(info.shape) + " holds more bytes than int64 counts");
      }
      numel *= dim;
    }
  }

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
  std::int64_t const expected = numel * d->size;
  if (info.end - info.begin != expected) {
    fail_tensor(path, name, range + " do not match shape " + shape_str(info.shape) + " of " + d->name +
                                ": expected " + std::to_string(expected) + " bytes, got " +
                                std::to_string(info.end - info.begin));
  }
  return info;
}

// Reads the tensors of `header` that `filter` keeps into `into`, straight into each tensor's storage.
void read_tensors(std::string const& path, SafetensorsHeader const& header, NameFilter const& filter,
                  TensorMap& into) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open for reading: ") + std::strerror(errno));
  for (TensorInfo const& info : header.tensors) {
    if (filter && !filter(info.name)) continue;
    at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(info.dtype));
    std::int64_t const nbytes = info.end - info.begin;
    if (nbytes > 0) {
      in.seekg(header.data_start + info.begin);
      in.read(static_cast<char*>(t.data_ptr()), nbytes);
      if (in.gcount() != nbytes) {
        fail_tensor(path, info.name, "read " + std::to_string(in.gcount()) + " of " + std::to_string(nbytes) +
                                         " bytes (did the file change while being read?)");
      }
    }
    if (info.dtype == at::kBool) {
      auto const* bytes = static_cast<unsigned char const*>(t.data_ptr());
      for (std::int64_t i = 0; i < nbytes; ++i) {
        if (bytes[i] > 1) {
          fail_tensor(path, info.name, "BOOL element " + std::to_string(i) + " is byte " +
                                           std::to_string(bytes[i]) + ", expected 0 or 1");
        }
      }
    }
    if (!into.emplace(info.name, std::move(t)).second) {
      fail_tensor(path, info.name, "was already read from another file of this checkpoint");
    }
  }
}

std::string metadata_value(json const& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

[[noreturn]] void index_fail(std::string const& path, std::string const& what) {
  throw std::runtime_error("checkpoint index " + path + ": " + what);
}

Safetensors read_sharded(std::string const& path, NameFilter const& filter) {
  std::ifstream in(path);
  if (!in) index_fail(path, std::string("cannot open for reading: ") + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  json const doc = parse_json(text.str(), "checkpoint index " + path);
  if (!doc.is_object()) index_fail(path, "must be a JSON object {metadata, weight_map}; got " + describe(doc));
  auto const map_it = doc.find("weight_map");
  if (map_it == doc.end() || !map_it->is_object()) {
    index_fail(path, "needs \"weight_map\": {tensor name: shard file}; got " +
                         (map_it == doc.end() ? std::string("none") : describe(*map_it)));
  }

  Safetensors out;
  auto const meta_it = doc.find("metadata");
  if (meta_it != doc.end()) {
    if (!meta_it->is_object()) index_fail(path, "\"metadata\" must be an object; got " + describe(*meta_it));
    for (auto const& [k, v] : meta_it->items()) out.metadata[k] = metadata_value(v);
  }

  std::map<std::string, std::set<std::string>> shards;  // shard file → the tensors weight_map puts there
  for (auto const& [name, file] : map_it->items()) {
    if (!file.is_string()) {
      index_fail(path, "weight_map[" + in_quotes(name) + "] must be a shard file name; got " + describe(file));
    }
    std::string const f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      index_fail(path, "weight_map[" + in_quotes(name) + "] is " + in_quotes(f) +
                 ", not the name of a file in the index's folder");
    }
    shards[f].insert(name);
  }

  // Every shard's header is checked against weight_map before any tensor is read.
  std::string const dir = parent_dir(path);
  std::vector<std::pair<std::string, SafetensorsHeader>> headers;
  for (auto const& [file, names] : shards) {
    std::string const shard = join(dir, file);
    if (path_kind(shard) != PathKind::kFile) {
      index_fail(path, "weight_map puts " + std::to_string(names.size()) + " tensors (e.g. " + in_quotes(*names.begin()) +
                 ") in shard " + in_quotes(file) + ", which does not exist (looked for " + shard + ")");
    }
    SafetensorsHeader header = read_safetensors_header(shard);
    std::set<std::string> held;
    for (TensorInfo const& info : header.tensors) held.insert(info.name);
    for (std::string const& name : names) {
      if (held.count(name) == 0) {
        index_fail(path, "weight_map puts tensor " + in_quotes(name) + " in shard " + in_quotes(file) +
                   ", which does not hold it (the shard holds " + std::to_string(held.size()) + " tensors)");
      }
    }
    for (std::string const& name : held) {
      if (names.count(name) == 0) {
        auto const listed = map_it->find(name);
        index_fail(path, "shard " + in_quotes(file) + " holds tensor " + in_quotes(name) + ", which weight_map " +
                   (listed == map_it->end() ? std::string("does not list")
                                            : "puts in shard " + in_quotes(listed->get<std::string>())));
      }
    }
    headers.emplace_back(shard, std::move(header));
  }
  for (auto const& [shard, header] : headers) {
    read_tensors(shard, header, filter, out.tensors);
    out.files.push_back(shard);
  }
  return out;
}

// Writes a file through "<path>.tmp" and a rename, so `path` is never half written.
template <typename WriteBody>
void write_atomically(std::string const& path, WriteBody const& body) {
  std::string const tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, "cannot open " + tmp + " for writing: " + std::strerror(errno));
    body(out);
    out.close();
    if (out.fail()) {
      std::remove(tmp.c_str());
      fail(path, "writing " + tmp + " failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string const why = std::strerror(errno);
    std::remove(tmp.c_str());
    fail(path, "cannot rename " + tmp + " to it: " + why);
  }
}

bool is_checkpoint_file(std::string const& name) {
  static std::regex const shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSingleFile || name == kIndexFile || std::regex_match(name, shard);
}

}  // namespace

std::string safetensors_dtype_name(at::ScalarType dtype) {
  DtypeEntry const* d = find_dtype(dtype);
  if (d == nullptr) {
    throw std::invalid_argument(std::string("dtype ") + c10::toString(dtype) +
                                " has no safetensors name here (supported: " + supported_dtypes() + ")");
  }
  return d->name;
}

SafetensorsHeader read_safetensors_header(std::string const& path) {
  require_little_endian();
  std::int64_t size = 0;
  PathKind const kind = path_kind(path, &size);
  if (kind == PathKind::kMissing) {
    fail(path, errno == ENOENT ? std::string("no such file") : std::string("cannot stat: ") + std::strerror(errno));
  }
  if (kind != PathKind::kFile) fail(path, "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open for reading: ") + std::strerror(errno));
  if (size < 8) {
    fail(path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length that starts it");
  }
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > static_cast<std::uint64_t>(size - 8)) {
    fail(path, "header length " + std::to_string(n) + " is larger than the file allows: expected at most " +
                   std::to_string(size - 8) + " (file size " + std::to_string(size) + " minus 8)");
  }
  if (n > static_cast<std::uint64_t>(kMaxHeaderBytes)) {
    fail(path, "header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(kMaxHeaderBytes) +
                   " bytes");
  }
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (static_cast<std::uint64_t>(in.gcount()) != n) fail(path, "could not read the " + std::to_string(n) + "-byte header");
  if (text.empty() || text[0] != '{') {
    fail(path, "header must be a JSON object starting with '{'; got " +
                   (text.empty() ? std::string("an empty header")
                                 : "byte " + std::to_string(+static_cast<unsigned char>(text[0])) + " ('" +
                                       (std::isprint(static_cast<unsigned char>(text[0])) ? text.substr(0, 1) : "?") + "')"));
  }
  json const doc = parse_json(text, "safetensors " + path + ": header");
  if (!doc.is_object()) fail(path, "header must be a JSON object; got " + describe(doc));

  SafetensorsHeader header;
  header.data_start = 8 + static_cast<std::int64_t>(n);
  std::int64_t const buffer = size - header.data_start;
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

  std::sort(header.tensors.begin(), header.tensors.end(), [](TensorInfo const& a, TensorInfo const& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::int64_t covered = 0;
  std::string previous;
  for (TensorInfo const& info : header.tensors) {
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

Safetensors read_safetensors(std::string const& path, NameFilter const& filter) {
  SafetensorsHeader const header = read_safetensors_header(path);
  Safetensors out;
  out.metadata = header.metadata;
  read_tensors(path, header, filter, out.tensors);
  out.files.push_back(path);
  return out;
}

Safetensors read_checkpoint(std::string const& path, NameFilter const& filter) {
  PathKind const kind = path_kind(path);
  if (kind == PathKind::kMissing) throw std::runtime_error("checkpoint " + path + ": no such file or folder");
  if (kind != PathKind::kDirectory) return read_safetensors(path, filter);
  if (path_kind(join(path, kIndexFile)) != PathKind::kMissing) return read_sharded(join(path, kIndexFile), filter);
  if (path_kind(join(path, kSingleFile)) != PathKind::kMissing) return read_safetensors(join(path, kSingleFile), filter);
  throw std::runtime_error("checkpoint " + path + ": the folder holds neither " + kIndexFile + " nor " + kSingleFile);
}

void write_safetensors(std::string const& path, TensorMap const& tensors, Metadata const& metadata) {
  require_little_endian();
  struct Item {
    std::string const* name;
    at::Tensor const* tensor;
    DtypeEntry const* dtype;
    std::int64_t nbytes;
  };
  std::vector<Item> items;
  for (auto const& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") fail(path, "a tensor cannot be named " + in_quotes(name));
    if (!t.defined()) fail_tensor(path, name, "is an undefined tensor");
    DtypeEntry const* d = find_dtype(t.scalar_type());
    if (d == nullptr) {
      fail_tensor(path, name, std::string("dtype ") + c10::toString(t.scalar_type()) +
                                  " cannot be written (supported: " + supported_dtypes() + ")");
    }
    items.push_back({&name, &t, d, t.numel() * d->size});
  }
  // Widest elements first: with the header padded to 8 bytes, every tensor then starts aligned to its element size.
  std::stable_sort(items.begin(), items.end(), [](Item const& a, Item const& b) { return a.dtype->size > b.dtype->size; });

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json meta = ordered_json::object();
    for (auto const& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::int64_t offset = 0;
  for (Item const& item : items) {
    header[*item.name] = {{"dtype", item.dtype->name},
                          {"shape", item.tensor->sizes().vec()},
                          {"data_offsets", {offset, offset + item.nbytes}}};
    offset += item.nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (json::type_error const& e) {
    fail(path, std::string("tensor names and metadata must be valid UTF-8: ") + e.what());
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // the spec allows trailing spaces in the header

  write_atomically(path, [&](std::ofstream& out) {
    unsigned char len[8];
    std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i, n >>= 8) len[i] = static_cast<unsigned char>(n & 0xff);
    out.write(reinterpret_cast<char const*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (Item const& item : items) {
      if (item.nbytes == 0) continue;
      at::Tensor const c = item.tensor->detach().to(at::kCPU).contiguous();
      out.write(static_cast<char const*>(c.data_ptr()), item.nbytes);
    }
  });
}

std::vector<std::string> write_checkpoint(std::string const& dir, TensorMap const& tensors,
                                          std::int64_t max_shard_bytes, Metadata const& metadata) {
  if (max_shard_bytes < 0) {
    throw std::invalid_argument("write_checkpoint: max_shard_bytes must be >= 0 (0 = one file); got " +
                                std::to_string(max_shard_bytes));
  }
  make_dirs(dir);

  std::int64_t total = 0;
  std::vector<TensorMap> shards(1);
  std::int64_t in_shard = 0;
  for (auto const& [name, t] : tensors) {
    std::int64_t const nbytes = t.defined() ? t.numel() * static_cast<std::int64_t>(t.element_size()) : 0;
    if (max_shard_bytes > 0 && !shards.back().empty() && in_shard + nbytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().emplace(name, t);
    in_shard += nbytes;
    total += nbytes;
  }

  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_safetensors(join(dir, kSingleFile), tensors, metadata);
    written.push_back(kSingleFile);
  } else {
    ordered_json weight_map = ordered_json::object();
    std::map<std::string, std::string> names;  // sorted weight_map, as transformers writes it
    for (std::size_t i = 0; i < shards.size(); ++i) {
      char file[64];
      std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      write_safetensors(join(dir, file), shards[i], metadata);
      written.push_back(file);
      for (auto const& entry : shards[i]) names[entry.first] = file;
    }
    for (auto const& [name, file] : names) weight_map[name] = file;
    ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
    std::string const text = index.dump(2) + "\n";
    write_atomically(join(dir, kIndexFile),
                     [&](std::ofstream& out) { out.write(text.data(), static_cast<std::streamsize>(text.size())); });
    written.push_back(kIndexFile);
  }

  for (std::string const& name : list_dir(dir)) {
    if (is_checkpoint_file(name) && std::find(written.begin(), written.end(), name) == written.end()) {
      std::remove(join(dir, name).c_str());
    }
  }
  return written;
}

void check_tensor(std::string const& name, at::Tensor const& tensor, c10::IntArrayRef expected_shape,
                  at::ScalarType expected_dtype) {
  std::string const what = "tensor " + in_quotes(name) + ": ";
  if (!tensor.defined()) throw std::runtime_error(what + "is missing (undefined)");
  c10::IntArrayRef const got = tensor.sizes();
  if (got != expected_shape) {
    std::string detail;
    if (got.size() != expected_shape.size()) {
      detail = "expected " + std::to_string(expected_shape.size()) + " dimensions, got " + std::to_string(got.size());
    } else {
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] != expected_shape[i]) {
          detail = "dimension " + std::to_string(i) + ": expected " + std::to_string(expected_shape[i]) + ", got " +
                   std::to_string(got[i]);
          break;
        }
      }
    }
    throw std::runtime_error(what + "shape " + shape_str(got) + " does not match the expected " +
                             shape_str(expected_shape) + " (" + detail + ")");
  }
  if (tensor.scalar_type() != expected_dtype) {
    throw std::runtime_error(what + "dtype " + c10::toString(tensor.scalar_type()) + " does not match the expected " +
                             c10::toString(expected_dtype));
  }
}

}  // namespace fusepack::checkpoint
