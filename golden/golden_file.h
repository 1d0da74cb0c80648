// Golden loss files: one reference run's provenance and its per-step records, as JSON. The
// format is specified in golden/FORMAT.md (so that a Python generator, e.g. the transformers one in golden/hf/, can
// write it too); this is its writer and its reader, which names the file and the field of every error.
// Plain C++ (nlohmann-json stays inside the .cpp).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

namespace fusepack::golden {

inline constexpr char kFormatName[] = "fusepack-golden";
inline constexpr std::int64_t kFormatVersion = 1;

// Where a run came from: everything needed to reproduce it. Every field is required.
struct Provenance {
  std::string command;           // the exact command line that produced the file
  std::string commit;            // git commit of the producing tree ("<sha>-dirty" when it had local changes)
  std::string fusepack_version;  // fusepack's version, or the generator's ("transformers 5.2.0") for a foreign one
  std::string date;              // UTC, ISO 8601: "2026-11-29T10:39:00Z"
  std::string model_config;      // a JSON object: the model's config.json fields (text; read back compact)
  std::string dataset;           // a JSON object: the data, e.g. {"path": ...} or a synthetic spec (text)
  std::uint64_t seed = 0;
  std::string dtype;             // "float64", "float32", "bfloat16" or "float16"
  std::string device;            // "cpu", "cuda" or the device's name
  std::int64_t world_size = 0;   // >= 1 ranks
  std::string batching;          // a JSON object: layout (padded/packed), token budget, micro-batches per step... (text)
};

// One optimizer step. Steps are 0-based optimizer steps (the schedule's convention).
struct StepRecord {
  std::int64_t step = 0;   // >= 0, strictly increasing within a file
  double loss = 0;         // the step's loss: Σ token CE / tokens over all micro-batches and ranks, before the update
  double grad_norm = 0;    // the global L2 gradient norm before clipping
  std::int64_t tokens = 0; // the step's target tokens (labels != -100) over all micro-batches and ranks, >= 1
  double lr = 0;           // the learning rate the step's update used
};

struct GoldenFile {
  Provenance provenance;
  std::vector<StepRecord> steps;  // >= 1 record
};

// A bad golden file, or a GoldenFile that cannot be written. The message reads "<file>: field '<field>': <what is
// wrong>", field being a path such as "provenance.seed" or "steps[3].loss" (empty when the file is not even JSON).
class GoldenError : public std::runtime_error {
 public:
  GoldenError(std::string file, std::string field, std::string const& what);
  std::string const& file() const { return file_; }
  std::string const& field() const { return field_; }

 private:
  std::string file_;
  std::string field_;
};

// Checks every rule of FORMAT.md (required fields non-empty, JSON objects, known dtype, world_size >= 1, at least one
// step, steps strictly increasing, finite values, grad_norm and lr >= 0, tokens >= 1); throws GoldenError with
// `name` as the file.
void validate(GoldenFile const& file, std::string const& name);

// Validates, then writes: the header pretty-printed, one step record per line. Doubles are written with the
// shortest text that reads back to the same double, so a write/read round trip is exact.
void write_golden(std::string const& path, GoldenFile const& file);
void write_golden(std::ostream& out, GoldenFile const& file, std::string const& name = "<stream>");

// Reads and validates; throws GoldenError naming the file and the first bad field. Unknown fields are errors too (a
// misspelt field would otherwise be lost silently); so are a directory, UTF-16 text and nesting deeper than
// packing::kMaxJsonDepth (checked before parsing: the parser recurses once per level).
GoldenFile read_golden(std::string const& path);
GoldenFile read_golden(std::istream& in, std::string const& name);

// Now, in the `date` format.
std::string utc_now_iso8601();

// The provenance as one compact JSON object, its JSON-text fields (model_config, dataset, batching) as objects: the
// golden file's header, and the first line of a run's metrics file.
std::string provenance_json(Provenance const& p);

}  // namespace fusepack::golden
