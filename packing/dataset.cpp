#include "packing/dataset.h"

#include "packing/json_input.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <istream>
#include <ostream>
#include <sstream>

namespace fusepack::packing {
namespace {

using nlohmann::json;

// A line nlohmann cannot parse, said in the user's terms. A line holding only the start of an object ("{", or
// '{"input_ids": [') is most likely pretty-printed JSON, which spreads one object over many lines.
std::string parse_error_message(std::string const& text, nlohmann::json::parse_error const& e) {
  std::size_t const first = text.find_first_not_of(" \t\r");
  std::size_t const last = text.find_last_not_of(" \t\r");
  bool const opens_only = text[first] == '{' && text[last] != '}';
  bool const closes_only = (text[first] == '}' || text[first] == ']' || text[first] == '"') && text[last] != '}';
  std::string const detail = json_parse_detail(e.what());
  std::size_t const colon = detail.find(": ");
  std::string const what = "malformed JSON at column " + std::to_string(e.byte) + ": " +
                           (colon == std::string::npos ? detail : detail.substr(colon + 2));
  if (opens_only || closes_only) {
    return what + "; expected JSON Lines: one whole JSON object per line (this looks like pretty-printed JSON, one "
                  "object spread over several lines: write each example on a line of its own)";
  }
  return what + "; expected JSON Lines: one JSON object per line";
}

class LineReader {
 public:
  LineReader(std::string name, std::int64_t line, std::int64_t vocab_size)
      : name_(std::move(name)), line_(line), vocab_size_(vocab_size) {}

  [[noreturn]] void fail(std::string const& field, std::string const& what) const {
    throw DatasetError(name_, line_, field, what);
  }

  static std::string element(std::size_t i) { return "element " + std::to_string(i); }

  // An array of ids; `allow_ignore` admits kIgnoreIndex (labels).
  std::vector<std::int32_t> ids(json const& v, std::string const& field, bool allow_ignore) const {
    if (!v.is_array()) fail(field, "must be an array of integers; got " + describe_json(v));
    std::vector<std::int32_t> out;
    out.reserve(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      json const& e = v[i];
      if (!e.is_number_integer()) fail(field, element(i) + " is " + describe_json(e) + ", not an integer");
      bool const in_vocab = e.is_number_unsigned() ? e.get<std::uint64_t>() < static_cast<std::uint64_t>(vocab_size_)
                                                   : e.get<std::int64_t>() >= 0 && e.get<std::int64_t>() < vocab_size_;
      bool const ignored = allow_ignore && !e.is_number_unsigned() && e.get<std::int64_t>() == kIgnoreIndex;
      if (!in_vocab && !ignored) {
        fail(field, element(i) + " is " + e.dump() + ", outside the vocabulary [0, " + std::to_string(vocab_size_) +
                        ")" + (allow_ignore ? " and not the ignore index -100" : ""));
      }
      out.push_back(static_cast<std::int32_t>(e.get<std::int64_t>()));
    }
    return out;
  }

  Example example(std::string const& text) const {
    if (std::string const problem = json_text_problem(text); !problem.empty()) fail("", "the line " + problem);
    json doc;
    // nlohmann keeps the last of two equal keys; a line that gives input_ids or labels twice is ambiguous.
    std::string duplicate;
    std::vector<std::string> seen;
    auto const on_event = [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
        std::string const& key = parsed.get_ref<std::string const&>();
        if (key == "input_ids" || key == "labels") {
          if (std::find(seen.begin(), seen.end(), key) != seen.end() && duplicate.empty()) duplicate = key;
          seen.push_back(key);
        }
      }
      return true;
    };
    try {
      doc = json::parse(text, on_event);
    } catch (json::parse_error const& e) {
      fail("", parse_error_message(text, e));
    } catch (json::out_of_range const& e) {  // a number beyond double's range, such as 1e400
      fail("", "a number is out of range (" + json_parse_detail(e.what()) + "); token ids must be integers");
    }
    if (!duplicate.empty()) {
      fail(duplicate, "given twice on the line; each line must give \"" + duplicate + "\" once");
    }
    if (doc.is_array() && !doc.empty() && doc.front().is_object()) {
      fail("", "a line must hold one JSON object; got an array of " + std::to_string(doc.size()) +
                   " objects (JSON Lines has one object per line, not one JSON array of them)");
    }
    if (!doc.is_object()) {
      fail("", "a line must hold one JSON object (JSON Lines: one JSON object per line); got " + describe_json(doc));
    }
    auto const ids_it = doc.find("input_ids");
    if (ids_it == doc.end()) fail("input_ids", "missing (each line needs \"input_ids\": [...])");
    Example ex;
    ex.input_ids = ids(*ids_it, "input_ids", false);
    if (ex.input_ids.empty()) fail("input_ids", "empty example (zero tokens); examples must have at least 1 token");
    auto const labels_it = doc.find("labels");
    if (labels_it == doc.end()) {
      ex.labels = ex.input_ids;
    } else {
      ex.labels = ids(*labels_it, "labels", true);
      if (ex.labels.size() != ex.input_ids.size()) {
        fail("labels", "has " + std::to_string(ex.labels.size()) + " entries but input_ids has " +
                           std::to_string(ex.input_ids.size()) + "; they must be the same length (unshifted)");
      }
      for (std::size_t p = 0; p < ex.labels.size(); ++p) {
        if (ex.labels[p] != kIgnoreIndex && ex.labels[p] != ex.input_ids[p]) {
          fail("labels", element(p) + " is " + std::to_string(ex.labels[p]) + " but input_ids[" + std::to_string(p) +
                             "] is " + std::to_string(ex.input_ids[p]) +
                             "; a label must be -100 or the token at its position (unshifted HF convention)");
        }
      }
    }
    return ex;
  }

 private:
  std::string name_;
  std::int64_t line_;
  std::int64_t vocab_size_;
};

void check_vocab(std::int64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > (std::int64_t{1} << 31)) {
    throw std::invalid_argument("vocab_size must be in [1, 2^31]; got " + std::to_string(vocab_size));
  }
}

std::string location(std::string const& file, std::int64_t line, std::string const& field, std::string const& what) {
  std::string s = file;
  if (line > 0) s += ":" + std::to_string(line);
  s += ": ";
  if (!field.empty()) s += "field '" + field + "': ";
  return s + what;
}

}  // namespace

DatasetError::DatasetError(std::string file, std::int64_t line, std::string field, std::string const& what)
    : std::runtime_error(location(file, line, field, what)),
      file_(std::move(file)),
      line_(line),
      field_(std::move(field)) {}

std::int64_t read_jsonl_numbered(std::istream& in, std::string const& name, std::int64_t vocab_size,
                                 NumberedExampleSink const& sink, Progress const* progress, std::int64_t total_bytes) {
  check_vocab(vocab_size);
  std::string text;
  std::int64_t line = 0, count = 0, bytes = 0;
  ProgressPhase phase(progress, "reading " + name);
  auto read_so_far = [&](double seconds) {
    std::string status = grouped(line) + " lines, " + megabytes(bytes);
    if (total_bytes > 0) {
      char share[32];
      std::snprintf(share, sizeof share, " (%.1f%%)",
                    100.0 * static_cast<double>(bytes) / static_cast<double>(total_bytes));
      status += " of " + megabytes(total_bytes) + share;
    }
    return status + ", " + megabytes_per_second(bytes, seconds);
  };
  while (std::getline(in, text)) {
    ++line;
    bytes += static_cast<std::int64_t>(text.size()) + 1;
    phase.update(read_so_far);
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    sink(LineReader(name, line, vocab_size).example(text), line);
    ++count;
  }
  if (in.bad()) throw DatasetError(name, line + 1, "", "read error");
  phase.done(grouped(count) + " examples from " + grouped(line) + " lines, " + megabytes(bytes));
  return count;
}

std::int64_t read_jsonl(std::istream& in, std::string const& name, std::int64_t vocab_size, ExampleSink const& sink) {
  return read_jsonl_numbered(in, name, vocab_size, [&](Example&& ex, std::int64_t) { sink(std::move(ex)); });
}

std::int64_t read_jsonl_numbered(std::string const& path, std::int64_t vocab_size, NumberedExampleSink const& sink,
                                 Progress const* progress) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw DatasetError(path, 0, "", "is a directory; expected a JSON Lines file (one JSON object per line)");
  }
  std::ifstream in(path);
  if (!in) throw DatasetError(path, 0, "", "cannot open the file for reading");
  std::uintmax_t const size = std::filesystem::file_size(path, ec);  // a pipe or FIFO has none
  return read_jsonl_numbered(in, path, vocab_size, sink, progress, ec ? -1 : static_cast<std::int64_t>(size));
}

std::int64_t read_jsonl(std::string const& path, std::int64_t vocab_size, ExampleSink const& sink,
                        Progress const* progress) {
  return read_jsonl_numbered(path, vocab_size, [&](Example&& ex, std::int64_t) { sink(std::move(ex)); }, progress);
}

std::vector<Example> load_jsonl(std::string const& path, std::int64_t vocab_size) {
  std::vector<Example> out;
  read_jsonl(path, vocab_size, [&](Example&& ex) { out.push_back(std::move(ex)); });
  return out;
}

void write_jsonl(std::ostream& out, std::vector<Example> const& examples) {
  auto write_ids = [&](std::vector<std::int32_t> const& ids) {
    out << '[';
    for (std::size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
    out << ']';
  };
  for (Example const& ex : examples) {
    out << "{\"input_ids\":";
    write_ids(ex.input_ids);
    out << ",\"labels\":";
    write_ids(ex.labels);
    out << "}\n";
  }
}

void write_jsonl(std::string const& path, std::vector<Example> const& examples) {
  std::ofstream out(path);
  if (!out) throw DatasetError(path, 0, "", "cannot open the file for writing");
  write_jsonl(out, examples);
  out.flush();
  if (!out) throw DatasetError(path, 0, "", "write error");
}

void check_example(Example const& ex, std::int64_t vocab_size, std::string const& what) {
  check_vocab(vocab_size);
  if (ex.input_ids.empty()) throw std::invalid_argument(what + ": empty example (zero tokens)");
  if (ex.labels.size() != ex.input_ids.size()) {
    throw std::invalid_argument(what + ": labels has " + std::to_string(ex.labels.size()) +
                                " entries but input_ids has " + std::to_string(ex.input_ids.size()));
  }
  for (std::size_t p = 0; p < ex.input_ids.size(); ++p) {
    std::int32_t const id = ex.input_ids[p], label = ex.labels[p];
    if (id < 0 || id >= vocab_size) {
      throw std::invalid_argument(what + ": input_ids[" + std::to_string(p) + "]=" + std::to_string(id) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
    if (label != kIgnoreIndex && label != id) {
      throw std::invalid_argument(what + ": labels[" + std::to_string(p) + "]=" + std::to_string(label) +
                                  " is neither -100 nor the token input_ids[" + std::to_string(p) +
                                  "]=" + std::to_string(id));
    }
  }
}

}  // namespace fusepack::packing
