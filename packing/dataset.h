// Datasets of tokenized examples as JSONL in the Hugging Face convention, one example per line:
//   {"input_ids": [151644, 872, ...], "labels": [-100, -100, ..., 872, ...]}
// "labels" is optional (absent = every position supervised, labels = input_ids); other fields are ignored; blank
// lines are skipped. Files are streamed: each line is parsed, checked and handed to a sink, then dropped. A line's
// JSON is checked before it is parsed (packing/json_input.h: nesting depth, UTF-16); a line naming input_ids or labels
// twice is an error. Examples whose labels are all -100 are valid here (the trainer refuses a run in which one has no
// target).
#pragma once

#include "packing/example.h"
#include "packing/progress.h"

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

namespace fusepack::packing {

// A bad dataset. The message reads "<file>:<line>: field '<field>': <what is wrong>"; line is 1-based (0 when the
// error concerns the whole file) and field is empty when the line is not even JSON.
class DatasetError : public std::runtime_error {
 public:
  DatasetError(std::string file, std::int64_t line, std::string field, std::string const& what);
  std::string const& file() const { return file_; }
  std::int64_t line() const { return line_; }
  std::string const& field() const { return field_; }

 private:
  std::string file_;
  std::int64_t line_;
  std::string field_;
};

using ExampleSink = std::function<void(Example&& example)>;

// Reads every example of `path` in file order and calls `sink` with it; returns the number of examples. Ids must lie
// in [0, vocab_size); examples must be non-empty (docs/contracts.md, batches); labels must have the length of input_ids
// and hold, at each position, kIgnoreIndex or that position's token (docs/contracts.md, batches defines the shifted
// label of t as tokens[t+1] or -100, so a label that is some other id has no meaning here). Throws DatasetError at the
// first bad line. With `progress`, a long read reports itself every interval ("reading <path>: 1,234,567 lines, 812.3
// of 2,048.0 MB (39.7%), 401.2 MB/s"; progress.h), silent when it takes less.
std::int64_t read_jsonl(std::string const& path, std::int64_t vocab_size, ExampleSink const& sink,
                        Progress const* progress = nullptr);
// The same over a stream; `name` stands for the file in error messages.
std::int64_t read_jsonl(std::istream& in, std::string const& name, std::int64_t vocab_size, ExampleSink const& sink);

// The same, telling the sink each example's 1-based line number in the file. `total_bytes` (of the stream, -1 when
// unknown) lets the progress lines say how much of it was read.
using NumberedExampleSink = std::function<void(Example&& example, std::int64_t line)>;
std::int64_t read_jsonl_numbered(std::string const& path, std::int64_t vocab_size, NumberedExampleSink const& sink,
                                 Progress const* progress = nullptr);
std::int64_t read_jsonl_numbered(std::istream& in, std::string const& name, std::int64_t vocab_size,
                                 NumberedExampleSink const& sink, Progress const* progress = nullptr,
                                 std::int64_t total_bytes = -1);

std::vector<Example> load_jsonl(std::string const& path, std::int64_t vocab_size);

// Writes examples in the format read_jsonl reads (labels always written).
void write_jsonl(std::string const& path, std::vector<Example> const& examples);
void write_jsonl(std::ostream& out, std::vector<Example> const& examples);

// Checks one example against the rules above; throws std::invalid_argument naming `what` (e.g. "example 12").
void check_example(Example const& example, std::int64_t vocab_size, std::string const& what);

}  // namespace fusepack::packing
