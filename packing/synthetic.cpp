#include "packing/synthetic.h"

#include "packing/rng.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fusepack::packing {
namespace {

constexpr std::uint64_t kLengthStream = 0x4C454E47;   // "LENG"
constexpr std::uint64_t kExampleStream = 0x45584D50;  // "EXMP"
constexpr char kPrefix[] = "synthetic:";

[[noreturn]] void bad(std::string const& message) { throw std::invalid_argument("synthetic spec: " + message); }

std::int64_t parse_int(std::string const& key, std::string const& value) {
  char* end = nullptr;
  errno = 0;
  long long const v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE || std::isspace(static_cast<unsigned char>(value[0]))) {
    bad(key + "=" + value + " is not an integer");
  }
  return v;
}

std::uint64_t parse_unsigned(std::string const& key, std::string const& value) {
  char* end = nullptr;
  errno = 0;
  unsigned long long const v = std::strtoull(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE || !std::isdigit(static_cast<unsigned char>(value[0]))) {
    bad(key + "=" + value + " is not an unsigned integer");
  }
  return v;
}

double parse_double(std::string const& key, std::string const& value) {
  char* end = nullptr;
  double const v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(v) || std::isspace(static_cast<unsigned char>(value[0]))) {
    bad(key + "=" + value + " is not a finite number");
  }
  return v;
}

// The shortest text that reads back as exactly v ("900", "0.9").
std::string shortest(double v) {
  char buf[32];
  auto const result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

}  // namespace

void SyntheticSpec::validate() const {
  if (num_examples < 1 || num_examples > kMaxSyntheticExamples) {
    bad("n must be in [1, " + std::to_string(kMaxSyntheticExamples) + "]; got " + std::to_string(num_examples));
  }
  if (vocab_size < 1 || vocab_size > (std::int64_t{1} << 31)) {
    bad("vocab must be in [1, 2^31]; got " + std::to_string(vocab_size));
  }
  if (min_length < 1) bad("min must be >= 1 (empty examples are not allowed); got " + std::to_string(min_length));
  if (max_length < min_length) {
    bad("max must be >= min; got max=" + std::to_string(max_length) + ", min=" + std::to_string(min_length));
  }
  if (max_length > (std::int64_t{1} << 30)) bad("max must be <= 2^30; got " + std::to_string(max_length));
  if (!(median_length >= static_cast<double>(min_length) && median_length <= static_cast<double>(max_length))) {
    std::ostringstream os;
    os << "median must lie in [min, max] = [" << min_length << ", " << max_length << "]; got " << median_length;
    bad(os.str());
  }
  if (!(sigma >= 0 && sigma <= 10)) {
    std::ostringstream os;
    os << "sigma must be in [0, 10]; got " << sigma;
    bad(os.str());
  }
  if (!(prompt_fraction >= 0 && prompt_fraction < 1)) {
    std::ostringstream os;
    os << "prompt must be in [0, 1); got " << prompt_fraction;
    bad(os.str());
  }
}

std::string SyntheticSpec::str() const {
  std::ostringstream os;
  os << kPrefix << "n=" << num_examples << ",vocab=" << vocab_size << ",median=" << shortest(median_length)
     << ",sigma=" << shortest(sigma) << ",min=" << min_length << ",max=" << max_length
     << ",prompt=" << shortest(prompt_fraction) << ",seed=" << seed;
  return os.str();
}

SyntheticSpec parse_synthetic_spec(std::string const& text, SyntheticSpec const& base) {
  std::string const prefix = kPrefix;
  if (text.compare(0, prefix.size(), prefix) != 0) {
    bad("'" + text + "' must start with '" + prefix + "' (e.g. synthetic:n=10000,median=900,sigma=0.9)");
  }
  SyntheticSpec spec = base;
  std::set<std::string> seen;
  std::string const body = text.substr(prefix.size());
  std::size_t pos = 0;
  while (pos < body.size()) {
    std::size_t const comma = std::min(body.find(',', pos), body.size());
    std::string const item = body.substr(pos, comma - pos);
    pos = comma + 1;
    std::size_t const eq = item.find('=');
    if (eq == std::string::npos || eq == 0) bad("'" + item + "' is not key=value (in '" + text + "')");
    std::string const key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!seen.insert(key).second) bad("key '" + key + "' given twice (in '" + text + "')");
    if (key == "n") {
      spec.num_examples = parse_int(key, value);
    } else if (key == "vocab") {
      spec.vocab_size = parse_int(key, value);
    } else if (key == "median") {
      spec.median_length = parse_double(key, value);
    } else if (key == "sigma") {
      spec.sigma = parse_double(key, value);
    } else if (key == "min") {
      spec.min_length = parse_int(key, value);
    } else if (key == "max") {
      spec.max_length = parse_int(key, value);
    } else if (key == "prompt") {
      spec.prompt_fraction = parse_double(key, value);
    } else if (key == "seed") {
      spec.seed = parse_unsigned(key, value);
    } else {
      bad("unknown key '" + key + "' (known: n, vocab, median, sigma, min, max, prompt, seed)");
    }
  }
  spec.validate();
  return spec;
}

std::vector<std::int64_t> synthetic_lengths(SyntheticSpec const& spec) {
  spec.validate();
  Rng rng(mix_seed({spec.seed, kLengthStream}));
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(spec.num_examples));
  double const lo = static_cast<double>(spec.min_length), hi = static_cast<double>(spec.max_length);
  for (std::int64_t& len : lengths) {
    double const x = std::round(spec.median_length * std::exp(spec.sigma * rng.normal()));
    len = static_cast<std::int64_t>(std::clamp(x, lo, hi));  // clamp first: exp() may overflow to inf
  }
  return lengths;
}

Example synthetic_example(SyntheticSpec const& spec, std::int64_t index, std::int64_t length) {
  spec.validate();
  if (length < 1) bad("example length must be >= 1; got " + std::to_string(length));
  Rng rng(mix_seed({spec.seed, kExampleStream, static_cast<std::uint64_t>(index)}));
  std::int64_t const vocab = spec.vocab_size;
  std::int64_t const start = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  std::int64_t const step = kSyntheticSteps[rng.below(std::size(kSyntheticSteps))] % vocab;
  auto const prompt = static_cast<std::int64_t>(spec.prompt_fraction * static_cast<double>(length));
  Example ex;
  ex.input_ids.resize(static_cast<std::size_t>(length));
  ex.labels.resize(static_cast<std::size_t>(length));
  std::int64_t token = start;
  for (std::int64_t p = 0; p < length; ++p) {
    ex.input_ids[p] = static_cast<std::int32_t>(token);
    ex.labels[p] = p < prompt ? kIgnoreIndex : static_cast<std::int32_t>(token);
    token = (token + step) % vocab;
  }
  return ex;
}

std::vector<Example> make_synthetic(SyntheticSpec const& spec) {
  std::vector<std::int64_t> const lengths = synthetic_lengths(spec);
  std::int64_t tokens = 0;
  for (std::int64_t len : lengths) tokens += len;  // <= 1e8 examples of <= 2^30 tokens: no overflow
  if (tokens > kMaxSyntheticTokens) {
    bad(spec.str() + " draws " + std::to_string(tokens) + " tokens; at most " + std::to_string(kMaxSyntheticTokens) +
        " (2^30, 8 bytes each in memory) are generated: lower n, median or max");
  }
  std::vector<Example> out;
  out.reserve(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    out.push_back(synthetic_example(spec, static_cast<std::int64_t>(i), lengths[i]));
  }
  return out;
}

}  // namespace fusepack::packing
