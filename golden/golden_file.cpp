#include "golden/golden_file.h"

#include "packing/json_input.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <istream>
#include <iterator>
#include <limits>
#include <ostream>
#include <set>
#include <sstream>

namespace fusepack::golden {
namespace {

using Json = nlohmann::ordered_json;

char const* const kDtypes[] = {"float64", "float32", "bfloat16", "float16"};

using packing::describe_json;

std::string step_field(std::size_t i, char const* field) {
  return "steps[" + std::to_string(i) + "]" + (field[0] ? std::string(".") + field : std::string());
}

std::string number_text(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// The rules that apply to a GoldenFile in memory (the reader checks the JSON types before it has one).
void validate_values(GoldenFile const& file, std::string const& name) {
  auto fail = [&](std::string const& field, std::string const& what) { throw GoldenError(name, field, what); };
  Provenance const& p = file.provenance;
  std::pair<char const*, std::string const*> const strings[] = {
      {"command", &p.command}, {"commit", &p.commit}, {"fusepack_version", &p.fusepack_version},
      {"date", &p.date},       {"dtype", &p.dtype},   {"device", &p.device}};
  for (auto const& [field, value] : strings) {
    if (value->empty()) fail(std::string("provenance.") + field, "is empty; every provenance field is required");
  }
  std::pair<char const*, std::string const*> const objects[] = {
      {"model_config", &p.model_config}, {"dataset", &p.dataset}, {"batching", &p.batching}};
  for (auto const& [field, text] : objects) {
    Json v;
    try {
      v = Json::parse(*text);
    } catch (Json::parse_error const&) {
      fail(std::string("provenance.") + field, "is not valid JSON: '" + text->substr(0, 40) + "'");
    }
    if (!v.is_object()) fail(std::string("provenance.") + field, "must be a JSON object; got " + describe_json(v));
  }
  bool known_dtype = false;
  for (char const* d : kDtypes) known_dtype = known_dtype || p.dtype == d;
  if (!known_dtype) fail("provenance.dtype", "is '" + p.dtype + "'; expected float64, float32, bfloat16 or float16");
  if (p.world_size < 1) fail("provenance.world_size", "must be >= 1; got " + std::to_string(p.world_size));

  if (file.steps.empty()) fail("steps", "is empty; a golden file records at least one step");
  for (std::size_t i = 0; i < file.steps.size(); ++i) {
    StepRecord const& s = file.steps[i];
    if (s.step < 0) fail(step_field(i, "step"), "must be >= 0; got " + std::to_string(s.step));
    if (i > 0 && s.step <= file.steps[i - 1].step) {
      fail(step_field(i, "step"), "is " + std::to_string(s.step) + " after step " +
                                      std::to_string(file.steps[i - 1].step) + "; steps must strictly increase");
    }
    if (!std::isfinite(s.loss)) fail(step_field(i, "loss"), "must be finite; got " + number_text(s.loss));
    if (!(std::isfinite(s.grad_norm) && s.grad_norm >= 0)) {
      fail(step_field(i, "grad_norm"), "must be finite and >= 0; got " + number_text(s.grad_norm));
    }
    if (!(std::isfinite(s.lr) && s.lr >= 0)) fail(step_field(i, "lr"), "must be finite and >= 0; got " + number_text(s.lr));
    if (s.tokens < 1) {
      fail(step_field(i, "tokens"), "must be >= 1 (a step without targets has no loss); got " + std::to_string(s.tokens));
    }
  }
}

Json to_json(Provenance const& p) {
  Json j;
  j["command"] = p.command;
  j["commit"] = p.commit;
  j["fusepack_version"] = p.fusepack_version;
  j["date"] = p.date;
  j["model_config"] = Json::parse(p.model_config);
  j["dataset"] = Json::parse(p.dataset);
  j["seed"] = p.seed;
  j["dtype"] = p.dtype;
  j["device"] = p.device;
  j["world_size"] = p.world_size;
  j["batching"] = Json::parse(p.batching);
  return j;
}

Json to_json(StepRecord const& s) {
  Json j;
  j["step"] = s.step;
  j["loss"] = s.loss;
  j["grad_norm"] = s.grad_norm;
  j["tokens"] = s.tokens;
  j["lr"] = s.lr;
  return j;
}

// Reads one JSON document field by field, failing with the field's path.
class Reader {
 public:
  explicit Reader(std::string name) : name_(std::move(name)) {}

  [[noreturn]] void fail(std::string const& field, std::string const& what) const {
    throw GoldenError(name_, field, what);
  }

  // `obj` at `path` must be an object holding exactly `keys`.
  void expect_keys(Json const& obj, std::string const& path, std::vector<char const*> const& keys) const {
    if (!obj.is_object()) fail(path, "must be a JSON object; got " + describe_json(obj));
    std::set<std::string> const known(keys.begin(), keys.end());
    for (auto const& item : obj.items()) {
      if (!known.count(item.key())) {
        std::string list;
        for (char const* k : keys) list += std::string(list.empty() ? "" : ", ") + k;
        fail(join(path, item.key()), "is not a field of this format (known: " + list + ")");
      }
    }
    for (char const* k : keys) {
      if (!obj.contains(k)) fail(join(path, k), "is missing");
    }
  }

  static std::string join(std::string const& path, std::string const& key) {
    return path.empty() ? key : path + "." + key;
  }

  std::string string(Json const& obj, std::string const& path, char const* key) const {
    Json const& v = obj.at(key);
    if (!v.is_string()) fail(join(path, key), "must be a string; got " + describe_json(v));
    return v.get<std::string>();
  }

  std::string object_text(Json const& obj, std::string const& path, char const* key) const {
    Json const& v = obj.at(key);
    if (!v.is_object()) fail(join(path, key), "must be a JSON object; got " + describe_json(v));
    return v.dump();
  }

  std::int64_t integer(Json const& v, std::string const& field) const {
    if (!v.is_number_integer()) fail(field, "must be an integer; got " + describe_json(v));
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(field, "is " + v.dump() + ", beyond int64");
    }
    return v.get<std::int64_t>();
  }

  std::uint64_t unsigned_integer(Json const& v, std::string const& field) const {
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<std::int64_t>() < 0)) {
      fail(field, "must be a non-negative integer; got " + describe_json(v));
    }
    return v.get<std::uint64_t>();
  }

  double number(Json const& v, std::string const& field) const {
    // JSON has no NaN or infinity: nlohmann writes them as null, so a null here is a non-finite value.
    if (v.is_null()) fail(field, "is null (a NaN or infinity was written); must be a finite number");
    if (!v.is_number()) fail(field, "must be a number; got " + describe_json(v));
    return v.get<double>();
  }

  GoldenFile file(Json const& doc) const {
    expect_keys(doc, "", {"format", "version", "provenance", "steps"});
    if (string(doc, "", "format") != kFormatName) {
      fail("format", "is '" + doc.at("format").get<std::string>() + "'; expected '" + kFormatName + "'");
    }
    if (std::int64_t const v = integer(doc.at("version"), "version"); v != kFormatVersion) {
      fail("version", "is " + std::to_string(v) + "; this reader knows version " + std::to_string(kFormatVersion));
    }
    GoldenFile out;
    Json const& p = doc.at("provenance");
    expect_keys(p, "provenance",
                {"command", "commit", "fusepack_version", "date", "model_config", "dataset", "seed", "dtype", "device",
                 "world_size", "batching"});
    Provenance& prov = out.provenance;
    prov.command = string(p, "provenance", "command");
    prov.commit = string(p, "provenance", "commit");
    prov.fusepack_version = string(p, "provenance", "fusepack_version");
    prov.date = string(p, "provenance", "date");
    prov.model_config = object_text(p, "provenance", "model_config");
    prov.dataset = object_text(p, "provenance", "dataset");
    prov.seed = unsigned_integer(p.at("seed"), "provenance.seed");
    prov.dtype = string(p, "provenance", "dtype");
    prov.device = string(p, "provenance", "device");
    prov.world_size = integer(p.at("world_size"), "provenance.world_size");
    prov.batching = object_text(p, "provenance", "batching");

    Json const& steps = doc.at("steps");
    if (!steps.is_array()) fail("steps", "must be an array of step records; got " + describe_json(steps));
    for (std::size_t i = 0; i < steps.size(); ++i) {
      Json const& s = steps[i];
      std::string const path = step_field(i, "");
      expect_keys(s, path, {"step", "loss", "grad_norm", "tokens", "lr"});
      StepRecord r;
      r.step = integer(s.at("step"), step_field(i, "step"));
      r.loss = number(s.at("loss"), step_field(i, "loss"));
      r.grad_norm = number(s.at("grad_norm"), step_field(i, "grad_norm"));
      r.tokens = integer(s.at("tokens"), step_field(i, "tokens"));
      r.lr = number(s.at("lr"), step_field(i, "lr"));
      out.steps.push_back(r);
    }
    return out;
  }

 private:
  std::string name_;
};

}  // namespace

GoldenError::GoldenError(std::string file, std::string field, std::string const& what)
    : std::runtime_error(file + ": " + (field.empty() ? std::string() : "field '" + field + "': ") + what),
      file_(std::move(file)),
      field_(std::move(field)) {}

void validate(GoldenFile const& file, std::string const& name) { validate_values(file, name); }

std::string provenance_json(Provenance const& p) { return to_json(p).dump(); }

void write_golden(std::ostream& out, GoldenFile const& file, std::string const& name) {
  validate_values(file, name);
  // The header indented like the rest of the document, then one compact record per line (easy to read and diff).
  std::string header = to_json(file.provenance).dump(2);
  std::string indented;
  for (char c : header) {
    indented += c;
    if (c == '\n') indented += "  ";
  }
  out << "{\n  \"format\": \"" << kFormatName << "\",\n  \"version\": " << kFormatVersion
      << ",\n  \"provenance\": " << indented << ",\n  \"steps\": [\n";
  for (std::size_t i = 0; i < file.steps.size(); ++i) {
    out << "    " << to_json(file.steps[i]).dump() << (i + 1 < file.steps.size() ? ",\n" : "\n");
  }
  out << "  ]\n}\n";
  if (!out) throw GoldenError(name, "", "write failed");
}

void write_golden(std::string const& path, GoldenFile const& file) {
  validate_values(file, path);  // before any file is created
  // Through "<path>.tmp" and a rename: `path` holds the old golden or the whole new one, never a partial file.
  std::string const tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw GoldenError(path, "", "cannot open " + tmp + " for writing");
    write_golden(out, file, path);
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      throw GoldenError(path, "", "write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw GoldenError(path, "", "cannot rename " + tmp + " to it");
  }
}

GoldenFile read_golden(std::istream& in, std::string const& name) {
  std::string const text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw GoldenError(name, "", "read error");
  if (std::string const problem = packing::json_text_problem(text); !problem.empty()) {
    throw GoldenError(name, "", "the file " + problem);
  }
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (Json::parse_error const& e) {
    throw GoldenError(name, "", "malformed JSON at byte " + std::to_string(e.byte) + " (" +
                                    packing::json_parse_detail(e.what()) +
                                    "); expected a golden file: one JSON object {\"format\": \"" + kFormatName +
                                    "\", ...}");
  } catch (Json::out_of_range const& e) {  // a number beyond double's range, such as 1e400
    throw GoldenError(name, "", "a number is out of range (" + packing::json_parse_detail(e.what()) +
                                    "); losses, grad norms and learning rates must be finite");
  }
  GoldenFile out = Reader(name).file(doc);
  validate_values(out, name);
  return out;
}

GoldenFile read_golden(std::string const& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw GoldenError(path, "", "is a directory; expected a golden file (JSON, format " + std::string(kFormatName) +
                                    ")");
  }
  std::ifstream in(path);
  if (!in) throw GoldenError(path, "", "cannot open for reading");
  return read_golden(in, path);
}

std::string utc_now_iso8601() {
  std::time_t const now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

}  // namespace fusepack::golden
