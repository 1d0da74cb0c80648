// Checkpoints in the Hugging Face format: safetensors files (8-byte little-endian header length N, an N-byte JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the byte buffer) and
// sharded folders (model.safetensors.index.json {"metadata": {...}, "weight_map": {name: file}}). CPU tensors only.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fusepack::checkpoint {

using TensorMap = std::map<std::string, at::Tensor>;  // name → tensor, in name order
using Metadata = std::map<std::string, std::string>;
// Which tensors to read: called once per tensor name of the checkpoint; false = its bytes are never read. Empty = all.
using NameFilter = std::function<bool(std::string const& name)>;

inline constexpr char kSingleFile[] = "model.safetensors";
inline constexpr char kIndexFile[] = "model.safetensors.index.json";
// The safetensors library refuses larger headers (a guard against files that would make a parser allocate without
// bound); fusepack does the same.
inline constexpr std::int64_t kMaxHeaderBytes = 100'000'000;

// One tensor as the header describes it. Safetensors dtypes read and written: F64, F32, F16, BF16, I64, I32, I16, I8,
// U8, BOOL.
struct TensorInfo {
  std::string name;
  at::ScalarType dtype;
  std::vector<std::int64_t> shape;  // [] for a 0-dim tensor; a 0 anywhere for an empty one (no bytes)
  std::int64_t begin = 0;           // byte range [begin, end) in the buffer that follows the header
  std::int64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // ascending begin (the JSON object's order means nothing)
  Metadata metadata;                // "__metadata__", empty when absent
  std::int64_t data_start = 0;      // file offset of the buffer: 8 + N
};

struct Safetensors {
  TensorMap tensors;               // contiguous CPU tensors
  Metadata metadata;               // the file's "__metadata__", or the index's "metadata" (non-strings as JSON text)
  std::vector<std::string> files;  // the safetensors files read, in reading order
};

// The header alone, fully validated: N fits in the file and under kMaxHeaderBytes; the header is a JSON object
// without duplicate names; every entry has a known dtype, a shape of non-negative integers and data_offsets whose
// length is numel × element size; the entries tile the buffer exactly (no overlap, no gap, nothing after the last).
// Throws std::runtime_error "safetensors <path>: [tensor '<name>': ]<problem>, expected <x>, got <y>".
SafetensorsHeader read_safetensors_header(std::string const& path);

// The tensors `filter` keeps, each read straight from the file into its own tensor (one copy in memory, never the
// whole file). Throws as read_safetensors_header, and when a BOOL tensor holds a byte other than 0 or 1.
Safetensors read_safetensors(std::string const& path, NameFilter const& filter = {});

// `path` is a safetensors file, or a folder holding kIndexFile (sharded: each shard read once; every weight_map entry
// must be in the shard it names and every tensor of a shard in weight_map) or else kSingleFile.
Safetensors read_checkpoint(std::string const& path, NameFilter const& filter = {});

// Where one tensor's bytes lie: its file, the file offset of that file's data buffer, and the header entry.
struct TensorLocation {
  std::string file;
  std::int64_t data_start = 0;
  TensorInfo info;
};

// A checkpoint's tensors by name, every header validated exactly as read_checkpoint validates it (same checks, same
// error messages, the index's weight_map checked against the shards), without reading any tensor bytes.
struct CheckpointIndex {
  std::map<std::string, TensorLocation> tensors;
  Metadata metadata;               // as read_checkpoint returns it
  std::vector<std::string> files;  // as read_checkpoint returns them
};

// `path` as read_checkpoint takes it.
CheckpointIndex index_checkpoint(std::string const& path);

// Rows [row_begin, row_end) along dim 0 of the tensor (0 <= row_begin <= row_end <= shape[0]), as a contiguous CPU
// tensor [row_end - row_begin, shape[1:]...] of the file's dtype, read with one seek and one read of exactly those
// bytes: a sharded trainer's rank reads its own slice of each parameter and nothing else. BOOL bytes are checked as
// read_safetensors checks them. Throws std::invalid_argument for a 0-dim tensor (no rows) or a range outside
// [0, shape[0]], naming the tensor, the range and the shape.
at::Tensor read_rows(TensorLocation const& where, std::int64_t row_begin, std::int64_t row_end);

// Writes `tensors` (any device, layout or supported dtype; each is copied to contiguous CPU memory one at a time) with
// the header padded by spaces to a multiple of 8 bytes and the buffer ordered by element size, then name, so every
// tensor starts aligned to its element size. Goes through "<path>.tmp" and a rename: no half-written file at `path`.
void write_safetensors(std::string const& path, TensorMap const& tensors, Metadata const& metadata = {});

// A checkpoint folder transformers' from_pretrained loads: kSingleFile when the tensors' bytes fit in max_shard_bytes
// (0 = no limit), else shards "model-00001-of-0000K.safetensors" filled in name order (a tensor larger than the limit
// gets a shard of its own) plus kIndexFile with metadata.total_size = the tensors' bytes. Each file carries
// `metadata` (transformers wants "format": "pt"). Creates the folder; removes checkpoint files of an earlier save
// there that this one does not overwrite (kSingleFile, kIndexFile, model-NNNNN-of-NNNNN.safetensors), as transformers'
// save_pretrained does. Returns the file names written. A CheckpointWriter (below) fed from `tensors`.
std::vector<std::string> write_checkpoint(std::string const& dir, TensorMap const& tensors,
                                          std::int64_t max_shard_bytes = 0,
                                          Metadata const& metadata = {{"format", "pt"}});

struct TensorEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<std::int64_t> shape;
};

// write_checkpoint for tensors that arrive one at a time (a sharded run gathers one parameter at a time; no process
// holds the whole model): the files, their headers and their order are planned from `entries` up front exactly as
// write_checkpoint plans them, and each tensor's bytes go straight to its file. Every file is written as "<file>.tmp"
// and renamed into place only by finish(); a writer destroyed before finish() removes its .tmp files.
class CheckpointWriter {
 public:
  // Creates `dir`; throws std::runtime_error "checkpoint <dir>: tensor '<name>': ..." for an entry it cannot write
  // (reserved or repeated name, unsupported dtype, negative dimension) and std::invalid_argument for
  // max_shard_bytes < 0.
  CheckpointWriter(std::string dir, std::vector<TensorEntry> entries, std::int64_t max_shard_bytes = 0,
                   Metadata metadata = {{"format", "pt"}});
  ~CheckpointWriter();
  CheckpointWriter(CheckpointWriter&&) noexcept;
  CheckpointWriter& operator=(CheckpointWriter&&) noexcept;

  // The names in the order write() must receive them: file by file, each file's tensors in its buffer order.
  std::vector<std::string> const& write_order() const;

  // The next tensor of write_order(), any device or layout, with its planned shape and dtype (check_tensor's
  // messages). A refused tensor writes nothing and leaves the writer as it was.
  void write(std::string const& name, at::Tensor const& tensor);

  // After every tensor was written: renames the files into place, writes kIndexFile (sharded case), removes the stale
  // checkpoint files of an earlier save; returns the file names written, as write_checkpoint does. Throws naming the
  // first tensor not written, after removing every .tmp file.
  std::vector<std::string> finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// For loaders: throws std::runtime_error "tensor '<name>': shape [2, 3] does not match the expected [3, 3]
// (dimension 0: expected 3, got 2)" or "...: dtype BFloat16 does not match the expected Float".
void check_tensor(std::string const& name, at::Tensor const& tensor, c10::IntArrayRef expected_shape,
                  at::ScalarType expected_dtype);

// "F32" for at::kFloat, and so on; throws std::invalid_argument for a dtype safetensors files here do not hold.
std::string safetensors_dtype_name(at::ScalarType dtype);

}  // namespace fusepack::checkpoint
