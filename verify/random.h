// Random inputs for the checks, drawn from the caller's seeded generator (a test's own, tests/support/env.h; or
// fusepack-gradcheck's --seed).
#pragma once

#include "reference/tensor.h"

#include <cstdint>
#include <random>
#include <vector>

namespace fusepack::verify {

ref::Tensor randn(ref::Shape shape, std::mt19937_64& rng, double stddev = 1.0);
ref::Tensor uniform(ref::Shape shape, std::mt19937_64& rng, double lo, double hi);
// Standard normal [..., D] whose every D-vector has norm >= min_norm (a vector below it is drawn again). Normalisations
// (x / sqrt(Σx² + eps)) have derivatives growing like eps/|x|^n near x = 0, so finite differences on rows near zero
// miss an fp64 tolerance of 1e-6 (with D = 1, |x| ≈ 0.02 already does); tests of normalising ops draw with this.
ref::Tensor randn_rows_away_from_zero(ref::Shape const& shape, std::mt19937_64& rng, double min_norm);
int uniform_int(std::mt19937_64& rng, int lo, int hi);  // inclusive

// cu_seqlens of examples with the given lengths: {0, l0, l0+l1, ...}.
std::vector<std::int32_t> cu_seqlens_from_lengths(std::vector<int> const& lengths);
// Random example lengths in [min_len, max_len] summing to anything; `count` examples.
std::vector<int> random_lengths(std::mt19937_64& rng, int count, int min_len, int max_len);

}  // namespace fusepack::verify
