#include "trainer/checkpoint/safetensors.h"

#include "packing/text.h"
#include "trainer/checkpoint/files.h"
#include "trainer/checkpoint/safetensors_header.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
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

// safetensors_header.h's dtypes as ATen's.
struct DtypeEntry {
  SafetensorsDtype dtype;
  at::ScalarType type;
};

constexpr DtypeEntry kDtypes[] = {
    {SafetensorsDtype::kF64, at::kDouble}, {SafetensorsDtype::kF32, at::kFloat}, {SafetensorsDtype::kF16, at::kHalf},
    {SafetensorsDtype::kBF16, at::kBFloat16}, {SafetensorsDtype::kI64, at::kLong}, {SafetensorsDtype::kI32, at::kInt},
    {SafetensorsDtype::kI16, at::kShort}, {SafetensorsDtype::kI8, at::kChar}, {SafetensorsDtype::kU8, at::kByte},
    {SafetensorsDtype::kBool, at::kBool},
};

DtypeEntry const* find_dtype(SafetensorsDtype dtype) {
  for (auto const& d : kDtypes) {
    if (dtype == d.dtype) return &d;
  }
  return nullptr;
}

DtypeEntry const* find_dtype(at::ScalarType type) {
  for (auto const& d : kDtypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

using packing::shape_str;

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

std::ifstream open_for_reading(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open for reading: ") + std::strerror(errno));
  return in;
}

// Bytes [offset, offset + nbytes) of the file into `dst`, which holds elements of `info` from index `first_element`
// on (named in the message for a BOOL byte other than 0 or 1).
void read_bytes(std::ifstream& in, std::string const& path, TensorInfo const& info, std::int64_t offset,
                std::int64_t nbytes, void* dst, std::int64_t first_element) {
  if (nbytes > 0) {
    in.seekg(offset);
    in.read(static_cast<char*>(dst), nbytes);
    if (in.gcount() != nbytes) {
      fail_tensor(path, info.name, "read " + std::to_string(in.gcount()) + " of " + std::to_string(nbytes) +
                                       " bytes (did the file change while being read?)");
    }
  }
  if (info.dtype == at::kBool) {
    auto const* bytes = static_cast<unsigned char const*>(dst);
    for (std::int64_t i = 0; i < nbytes; ++i) {
      if (bytes[i] > 1) {
        fail_tensor(path, info.name, "BOOL element " + std::to_string(first_element + i) + " is byte " +
                                         std::to_string(bytes[i]) + ", expected 0 or 1");
      }
    }
  }
}

// Reads the tensors of `header` that `filter` keeps into `into`, straight into each tensor's storage.
void read_tensors(std::string const& path, SafetensorsHeader const& header, NameFilter const& filter,
                  TensorMap& into) {
  std::ifstream in = open_for_reading(path);
  for (TensorInfo const& info : header.tensors) {
    if (filter && !filter(info.name)) continue;
    at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(info.dtype));
    read_bytes(in, path, info, header.data_start + info.begin, info.end - info.begin, t.data_ptr(), 0);
    if (!into.emplace(info.name, std::move(t)).second) {
      fail_tensor(path, info.name, "was already read from another file of this checkpoint");
    }
  }
}

[[noreturn]] void index_fail(std::string const& path, std::string const& what) {
  throw std::runtime_error("checkpoint index " + path + ": " + what);
}

// A checkpoint's safetensors files with their validated headers, in reading order, and its metadata; no tensor bytes
// read yet.
struct CheckpointFiles {
  std::vector<std::pair<std::string, SafetensorsHeader>> headers;
  Metadata metadata;
};

CheckpointFiles sharded_files(std::string const& path) {
  std::ifstream in(path);
  if (!in) index_fail(path, std::string("cannot open for reading: ") + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  ParsedIndex index = parse_safetensors_index(path, text.str());
  CheckpointFiles out;
  out.metadata = std::move(index.metadata);

  // Every shard's header is checked against weight_map before any tensor is read.
  std::string const dir = parent_dir(path);
  for (auto const& [file, names] : index.shards) {
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
        auto const listed = index.weight_map.find(name);
        index_fail(path, "shard " + in_quotes(file) + " holds tensor " + in_quotes(name) + ", which weight_map " +
                   (listed == index.weight_map.end() ? std::string("does not list")
                                                     : "puts in shard " + in_quotes(listed->second)));
      }
    }
    out.headers.emplace_back(shard, std::move(header));
  }
  return out;
}

CheckpointFiles single_file(std::string const& path) {
  CheckpointFiles out;
  out.headers.emplace_back(path, read_safetensors_header(path));
  out.metadata = out.headers.back().second.metadata;
  return out;
}

CheckpointFiles checkpoint_files(std::string const& path) {
  PathKind const kind = path_kind(path);
  if (kind == PathKind::kMissing) throw std::runtime_error("checkpoint " + path + ": no such file or folder");
  if (kind != PathKind::kDirectory) return single_file(path);
  if (path_kind(join(path, kIndexFile)) != PathKind::kMissing) return sharded_files(join(path, kIndexFile));
  if (path_kind(join(path, kSingleFile)) != PathKind::kMissing) return single_file(join(path, kSingleFile));
  throw std::runtime_error("checkpoint " + path + ": the folder holds neither " + kIndexFile + " nor " + kSingleFile);
}

Safetensors read_files(CheckpointFiles const& files, NameFilter const& filter) {
  Safetensors out;
  out.metadata = files.metadata;
  for (auto const& [file, header] : files.headers) {
    read_tensors(file, header, filter, out.tensors);
    out.files.push_back(file);
  }
  return out;
}

// A file written as "<path>.tmp" and renamed onto `path` by commit(), so `path` is never half written; destroyed
// uncommitted, it removes the .tmp.
class TmpFile {
 public:
  explicit TmpFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    out_.open(tmp_, std::ios::binary | std::ios::trunc);
    if (!out_) fail(path_, "cannot open " + tmp_ + " for writing: " + std::strerror(errno));
  }
  ~TmpFile() {
    if (committed_) return;
    out_.close();
    std::remove(tmp_.c_str());
  }
  TmpFile(TmpFile const&) = delete;
  TmpFile& operator=(TmpFile const&) = delete;

  void write(void const* data, std::int64_t nbytes) {
    out_.write(static_cast<char const*>(data), static_cast<std::streamsize>(nbytes));
    if (!out_) fail(path_, "writing " + tmp_ + " failed (disk full?)");
  }
  void close() {
    if (!out_.is_open()) return;
    out_.close();
    if (out_.fail()) fail(path_, "writing " + tmp_ + " failed (disk full?)");
  }
  // Flushed to disk before the rename, so a crash leaves the old file or the whole new one.
  void commit() {
    close();
    try {
      fsync_path(tmp_);
      rename_durably(tmp_, path_);
    } catch (std::exception const& e) {
      fail(path_, e.what());
    }
    committed_ = true;
  }

 private:
  std::string path_;
  std::string tmp_;
  std::ofstream out_;
  bool committed_ = false;
};

// The entries of `tensors`, in name order; `where` ("safetensors <path>", "checkpoint <dir>") starts the message for
// an undefined tensor.
std::vector<TensorEntry> entries_of(std::string const& where, TensorMap const& tensors) {
  std::vector<TensorEntry> entries;
  for (auto const& [name, t] : tensors) {
    if (!t.defined()) throw std::runtime_error(where + ": tensor " + in_quotes(name) + ": is an undefined tensor");
    entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  return entries;
}

// The bytes of a tensor a safetensors file can hold, or an error starting with `where`.
std::int64_t checked_bytes(std::string const& where, TensorEntry const& entry) {
  if (entry.name.empty() || entry.name == "__metadata__") {
    throw std::runtime_error(where + ": a tensor cannot be named " + in_quotes(entry.name));
  }
  std::string const what = where + ": tensor " + in_quotes(entry.name) + ": ";
  DtypeEntry const* d = find_dtype(entry.dtype);
  if (d == nullptr) {
    throw std::runtime_error(what + "dtype " + c10::toString(entry.dtype) + " cannot be written (supported: " +
                             supported_safetensors_dtypes() + ")");
  }
  for (std::int64_t const dim : entry.shape) {
    if (dim < 0) throw std::runtime_error(what + "shape " + shape_str(entry.shape) + " has a negative dimension");
  }
  std::int64_t const bytes = safetensors_byte_count(entry.shape, element_size(d->dtype));
  if (bytes < 0) {
    throw std::runtime_error(what + "shape " + shape_str(entry.shape) + " holds more bytes than int64 counts");
  }
  return bytes;
}

// One safetensors file fixed from its tensors' names, dtypes and shapes before any byte is written.
struct FilePlan {
  std::string path;
  std::string prefix;                     // the 8-byte header length and the header, padded by spaces to 8 bytes
  std::vector<TensorEntry const*> order;  // buffer order
};

// `entries` in name order, each passed by checked_bytes.
FilePlan plan_file(std::string path, std::vector<TensorEntry const*> entries, Metadata const& metadata) {
  // Widest elements first: with the header padded to 8 bytes, every tensor then starts aligned to its element size.
  std::stable_sort(entries.begin(), entries.end(), [](TensorEntry const* a, TensorEntry const* b) {
    return c10::elementSize(a->dtype) > c10::elementSize(b->dtype);
  });
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json meta = ordered_json::object();
    for (auto const& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::int64_t offset = 0;
  for (TensorEntry const* e : entries) {
    std::int64_t const nbytes =
        safetensors_byte_count(e->shape, static_cast<std::int64_t>(c10::elementSize(e->dtype)));
    header[e->name] = {{"dtype", dtype_name(find_dtype(e->dtype)->dtype)},
                       {"shape", e->shape},
                       {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (json::type_error const& e) {
    fail(path, std::string("tensor names and metadata must be valid UTF-8: ") + e.what());
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // the spec allows trailing spaces in the header

  FilePlan plan{std::move(path), std::string(8, '\0'), std::move(entries)};
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) plan.prefix[i] = static_cast<char>(n & 0xff);
  plan.prefix += text;
  return plan;
}

// A planned file receiving its tensors one at a time, in buffer order, each already checked against the plan.
class FileWriter {
 public:
  explicit FileWriter(FilePlan plan) : plan_(std::move(plan)) {}
  FilePlan const& plan() const { return plan_; }

  void append(at::Tensor const& tensor) {
    open();
    if (tensor.numel() > 0) {
      at::Tensor const c = tensor.detach().to(at::kCPU).contiguous();
      file_->write(c.data_ptr(), c.numel() * static_cast<std::int64_t>(c.element_size()));
    }
    if (++written_ == plan_.order.size()) file_->close();  // one file open at a time, however many shards
  }

  void commit() {
    open();  // a file of no tensors is its header alone
    file_->commit();
  }

 private:
  void open() {
    if (file_ != nullptr) return;
    file_ = std::make_unique<TmpFile>(plan_.path);
    file_->write(plan_.prefix.data(), static_cast<std::int64_t>(plan_.prefix.size()));
  }

  FilePlan plan_;
  std::unique_ptr<TmpFile> file_;
  std::size_t written_ = 0;
};

bool is_checkpoint_file(std::string const& name) {
  static std::regex const shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSingleFile || name == kIndexFile || std::regex_match(name, shard);
}

}  // namespace

std::string safetensors_dtype_name(at::ScalarType dtype) {
  DtypeEntry const* d = find_dtype(dtype);
  if (d == nullptr) {
    throw std::invalid_argument(std::string("dtype ") + c10::toString(dtype) +
                                " has no safetensors name here (supported: " + supported_safetensors_dtypes() + ")");
  }
  return dtype_name(d->dtype);
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
  std::uint64_t const n = safetensors_header_length(path, len, size, kMaxHeaderBytes);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (static_cast<std::uint64_t>(in.gcount()) != n) {
    fail(path, "could not read the " + std::to_string(n) + "-byte header");
  }
  ParsedHeader parsed = parse_safetensors_header(path, text, size);

  SafetensorsHeader header;
  header.data_start = parsed.data_start;
  header.metadata = std::move(parsed.metadata);
  for (HeaderEntry& e : parsed.tensors) {
    header.tensors.push_back({std::move(e.name), find_dtype(e.dtype)->type, std::move(e.shape), e.begin, e.end});
  }
  return header;
}

Safetensors read_safetensors(std::string const& path, NameFilter const& filter) {
  return read_files(single_file(path), filter);
}

Safetensors read_checkpoint(std::string const& path, NameFilter const& filter) {
  return read_files(checkpoint_files(path), filter);
}

CheckpointIndex index_checkpoint(std::string const& path) {
  CheckpointFiles files = checkpoint_files(path);
  CheckpointIndex out;
  out.metadata = std::move(files.metadata);
  for (auto& [file, header] : files.headers) {
    for (TensorInfo& info : header.tensors) {
      std::string const name = info.name;
      if (!out.tensors.emplace(name, TensorLocation{file, header.data_start, std::move(info)}).second) {
        fail_tensor(file, name, "is also in another file of this checkpoint");
      }
    }
    out.files.push_back(file);
  }
  return out;
}

at::Tensor read_rows(TensorLocation const& where, std::int64_t row_begin, std::int64_t row_end) {
  TensorInfo const& info = where.info;
  std::string const what = "safetensors " + where.file + ": tensor " + in_quotes(info.name) + ": rows [" +
                           std::to_string(row_begin) + ", " + std::to_string(row_end) + ")";
  if (info.shape.empty()) {
    throw std::invalid_argument(what + " cannot be read: the tensor is 0-dim (shape []) and has no rows");
  }
  std::int64_t const rows = info.shape[0];
  if (row_begin < 0 || row_begin > row_end || row_end > rows) {
    throw std::invalid_argument(what + " are not a range of dim 0 of shape " + shape_str(info.shape) +
                                ": expected 0 <= row_begin <= row_end <= " + std::to_string(rows));
  }
  std::vector<std::int64_t> shape = info.shape;
  shape[0] = row_end - row_begin;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(info.dtype));
  // The header was validated: the tensor's bytes are exactly rows × row_bytes.
  std::int64_t const row_bytes = rows == 0 ? 0 : (info.end - info.begin) / rows;
  std::int64_t const row_elements = row_bytes / static_cast<std::int64_t>(c10::elementSize(info.dtype));
  std::ifstream in = open_for_reading(where.file);
  read_bytes(in, where.file, info, where.data_start + info.begin + row_begin * row_bytes,
             (row_end - row_begin) * row_bytes, t.data_ptr(), row_begin * row_elements);
  return t;
}

void write_safetensors(std::string const& path, TensorMap const& tensors, Metadata const& metadata) {
  require_little_endian();
  std::string const where = "safetensors " + path;
  std::vector<TensorEntry> const entries = entries_of(where, tensors);
  std::vector<TensorEntry const*> planned;
  for (TensorEntry const& e : entries) {
    checked_bytes(where, e);
    planned.push_back(&e);
  }
  FileWriter file(plan_file(path, std::move(planned), metadata));
  for (TensorEntry const* e : file.plan().order) file.append(tensors.at(e->name));
  file.commit();
}

struct CheckpointWriter::Impl {
  std::string dir;
  std::vector<TensorEntry> entries;          // name order; the plans point into it
  std::vector<FileWriter> files;
  std::vector<std::string> file_names;       // as finish() returns them, before kIndexFile
  std::int64_t total_bytes = 0;
  std::vector<std::string> order;            // write_order()
  std::vector<std::size_t> file_of;          // order[i] goes to files[file_of[i]]
  std::vector<TensorEntry const*> entry_of;  // and is planned as *entry_of[i]
  std::size_t next = 0;                      // order[next] is the next tensor write() takes
  bool finished = false;

  std::string where() const { return "checkpoint " + dir; }
};

CheckpointWriter::CheckpointWriter(std::string dir, std::vector<TensorEntry> entries, std::int64_t max_shard_bytes,
                                   Metadata metadata)
    : impl_(std::make_unique<Impl>()) {
  require_little_endian();
  Impl& w = *impl_;
  w.dir = std::move(dir);
  if (max_shard_bytes < 0) {
    throw std::invalid_argument(w.where() + ": max_shard_bytes must be >= 0 (0 = one file); got " +
                                std::to_string(max_shard_bytes));
  }
  w.entries = std::move(entries);
  std::sort(w.entries.begin(), w.entries.end(),
            [](TensorEntry const& a, TensorEntry const& b) { return a.name < b.name; });

  // Shards filled in name order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<TensorEntry const*>> shards(1);
  std::int64_t in_shard = 0;
  for (std::size_t i = 0; i < w.entries.size(); ++i) {
    TensorEntry const& e = w.entries[i];
    if (i > 0 && w.entries[i - 1].name == e.name) {
      throw std::runtime_error(w.where() + ": tensor " + in_quotes(e.name) + " is planned twice");
    }
    std::int64_t const nbytes = checked_bytes(w.where(), e);
    if (max_shard_bytes > 0 && !shards.back().empty() && in_shard + nbytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&e);
    in_shard += nbytes;
    w.total_bytes += nbytes;
  }

  make_dirs(w.dir);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    w.file_names.push_back(shards.size() == 1 ? kSingleFile : file);
    w.files.emplace_back(plan_file(join(w.dir, w.file_names.back()), std::move(shards[i]), metadata));
    for (TensorEntry const* e : w.files.back().plan().order) {
      w.order.push_back(e->name);
      w.file_of.push_back(i);
      w.entry_of.push_back(e);
    }
  }
}

CheckpointWriter::~CheckpointWriter() = default;
CheckpointWriter::CheckpointWriter(CheckpointWriter&&) noexcept = default;
CheckpointWriter& CheckpointWriter::operator=(CheckpointWriter&&) noexcept = default;

std::vector<std::string> const& CheckpointWriter::write_order() const { return impl_->order; }

void CheckpointWriter::write(std::string const& name, at::Tensor const& tensor) {
  Impl& w = *impl_;
  if (w.finished) throw std::runtime_error(w.where() + ": write(" + in_quotes(name) + ") after finish()");
  if (w.next == w.order.size()) {
    throw std::runtime_error(w.where() + ": write() got tensor " + in_quotes(name) + " after all " +
                             std::to_string(w.order.size()) + " planned tensors were written");
  }
  if (name != w.order[w.next]) {
    bool const planned = std::find(w.order.begin(), w.order.end(), name) != w.order.end();
    throw std::runtime_error(w.where() + ": write() got tensor " + in_quotes(name) + ", expected " +
                             in_quotes(w.order[w.next]) + " (tensor " + std::to_string(w.next + 1) + " of " +
                             std::to_string(w.order.size()) + " in write_order())" +
                             (planned ? "" : "; " + in_quotes(name) + " is not in the plan"));
  }
  TensorEntry const& planned = *w.entry_of[w.next];
  try {
    check_tensor(name, tensor, planned.shape, planned.dtype);
  } catch (std::runtime_error const& e) {
    throw std::runtime_error(w.where() + ": " + e.what());
  }
  w.files[w.file_of[w.next]].append(tensor);
  ++w.next;
}

std::vector<std::string> CheckpointWriter::finish() {
  Impl& w = *impl_;
  if (w.finished) throw std::runtime_error(w.where() + ": finish() called twice");
  w.finished = true;
  if (w.next < w.order.size()) {
    std::string const missing = w.order[w.next];
    w.files.clear();  // removes the .tmp files
    throw std::runtime_error(w.where() + ": finish() before tensor " + in_quotes(missing) + " was written (" +
                             std::to_string(w.next) + " of " + std::to_string(w.order.size()) +
                             " tensors written); nothing was saved");
  }
  for (FileWriter& file : w.files) file.commit();
  std::vector<std::string> written = w.file_names;
  if (w.files.size() > 1) {
    std::map<std::string, std::string> files;  // sorted weight_map, as transformers writes it
    for (std::size_t i = 0; i < w.order.size(); ++i) files[w.order[i]] = w.file_names[w.file_of[i]];
    ordered_json weight_map = ordered_json::object();
    for (auto const& [name, file] : files) weight_map[name] = file;
    ordered_json index = {{"metadata", {{"total_size", w.total_bytes}}}, {"weight_map", std::move(weight_map)}};
    std::string const text = index.dump(2) + "\n";
    TmpFile file(join(w.dir, kIndexFile));
    file.write(text.data(), static_cast<std::int64_t>(text.size()));
    file.commit();
    written.push_back(kIndexFile);
  }

  for (std::string const& name : list_dir(w.dir)) {
    if (is_checkpoint_file(name) && std::find(written.begin(), written.end(), name) == written.end()) {
      std::remove(join(w.dir, name).c_str());
    }
  }
  return written;
}

std::vector<std::string> write_checkpoint(std::string const& dir, TensorMap const& tensors,
                                          std::int64_t max_shard_bytes, Metadata const& metadata) {
  CheckpointWriter writer(dir, entries_of("checkpoint " + dir, tensors), max_shard_bytes, metadata);
  for (std::string const& name : writer.write_order()) writer.write(name, tensors.at(name));
  return writer.finish();
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
