// Seeds and test levels, from the environment, the same for every test binary:
//   FUSEPACK_SEED        unsigned integer, default kDefaultSeed; every test prints the seed it ran with.
//   FUSEPACK_TEST_LEVEL  smoke (default, what CI runs) or full (many more random cases; the GPU machine's level).
#pragma once

#include "tests/support/verify.h"

#include <cstdint>
#include <random>
#include <string>

namespace fusepack::test {

inline constexpr std::uint64_t kDefaultSeed = 20261129;

enum class TestLevel { kSmoke, kFull };

std::uint64_t global_seed();   // throws std::invalid_argument naming the variable when it does not parse
TestLevel test_level();
char const* test_level_name(TestLevel level);
// Number of random cases: `smoke` at the smoke level, `full` at the full level.
int cases(int smoke, int full);

// The seed of the running GoogleTest test: global_seed() mixed with the test's full name, so a test's random inputs
// do not depend on which other tests ran before it or on the order of execution.
std::uint64_t test_seed();
std::mt19937_64 test_rng();
// global_seed() mixed with `key`; test_seed() is seed_for("Suite.Name") of the running test. For a test whose
// parameters include something its inputs must not depend on (the same inputs run through two kernel schedules),
// seeded from a key without that parameter.
std::uint64_t seed_for(std::string const& key);

}  // namespace fusepack::test
