// Synthetic datasets: log-normal example lengths (the shape of real fine-tuning sets: many short examples, a long
// tail) and a learnable token structure, so a tiny model's loss visibly falls. Each example is an arithmetic
// progression mod vocab_size with its own start and a step drawn from a small set: the next token follows from the
// previous two. Deterministic for a seed; example i does not depend on how many examples are drawn.
#pragma once

#include "packing/example.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::packing {

// The largest synthetic sets: n= examples (their lengths alone take 8 bytes each) and the tokens make_synthetic
// materialises (ids and labels, 8 bytes a token).
inline constexpr std::int64_t kMaxSyntheticExamples = 100'000'000;
inline constexpr std::int64_t kMaxSyntheticTokens = std::int64_t{1} << 30;

struct SyntheticSpec {
  std::int64_t num_examples = 1000;  // n=       in [1, kMaxSyntheticExamples]
  std::int64_t vocab_size = 32768;   // vocab=
  double median_length = 900;        // median=  median of the log-normal before clipping, within [min, max]
  double sigma = 0.9;                // sigma=   shape: lengths are median * exp(sigma * N(0, 1)), rounded
  std::int64_t min_length = 1;       // min=     clip
  std::int64_t max_length = 8192;    // max=     clip
  double prompt_fraction = 0.0;      // prompt=  leading share of each example with label -100, in [0, 1)
  std::uint64_t seed = 1;            // seed=

  void validate() const;    // throws std::invalid_argument naming the key and the bad value
  std::string str() const;  // the spec string that parses back to this spec
};

// "synthetic:n=10000,median=900,sigma=0.9,vocab=32768,max=8192,seed=1" (keys n, vocab, median, sigma, min, max,
// prompt, seed; any subset, in any order); unnamed keys keep their value in `base`. Throws std::invalid_argument
// for a missing "synthetic:" prefix, unknown or repeated keys, and values that do not parse or are out of range.
SyntheticSpec parse_synthetic_spec(std::string const& text, SyntheticSpec const& base = {});

// The steps an example's progression may take.
inline constexpr std::int32_t kSyntheticSteps[] = {1, 2, 3, 5, 7};

std::vector<std::int64_t> synthetic_lengths(SyntheticSpec const& spec);  // the lengths make_synthetic draws
Example synthetic_example(SyntheticSpec const& spec, std::int64_t index, std::int64_t length);
// Throws std::invalid_argument when the drawn lengths add up to more than kMaxSyntheticTokens.
std::vector<Example> make_synthetic(SyntheticSpec const& spec);

}  // namespace fusepack::packing
