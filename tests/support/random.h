// Random inputs for tests, drawn from the test's own seeded generator (tests/support/env.h).
#pragma once

#include "reference/tensor.h"

#include <cstdint>
#include <random>
#include <vector>

namespace fusepack::test {

ref::Tensor randn(ref::Shape shape, std::mt19937_64& rng, double stddev = 1.0);
ref::Tensor uniform(ref::Shape shape, std::mt19937_64& rng, double lo, double hi);
int uniform_int(std::mt19937_64& rng, int lo, int hi);  // inclusive

// cu_seqlens of examples with the given lengths: {0, l0, l0+l1, ...}.
std::vector<std::int32_t> cu_seqlens_from_lengths(std::vector<int> const& lengths);
// Random example lengths in [min_len, max_len] summing to anything; `count` examples.
std::vector<int> random_lengths(std::mt19937_64& rng, int count, int min_len, int max_len);

}  // namespace fusepack::test
