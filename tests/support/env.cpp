#include "tests/support/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>

namespace fusepack::test {

std::uint64_t global_seed() {
  char const* s = std::getenv("FUSEPACK_SEED");
  if (!s || !*s) return kDefaultSeed;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (*end != '\0' || s[0] == '-') {
    throw std::invalid_argument(std::string("FUSEPACK_SEED must be an unsigned integer; got '") + s + "'");
  }
  return v;
}

TestLevel test_level() {
  char const* s = std::getenv("FUSEPACK_TEST_LEVEL");
  if (!s || !*s || std::string(s) == "smoke") return TestLevel::kSmoke;
  if (std::string(s) == "full") return TestLevel::kFull;
  throw std::invalid_argument(std::string("FUSEPACK_TEST_LEVEL must be 'smoke' or 'full'; got '") + s + "'");
}

char const* test_level_name(TestLevel level) { return level == TestLevel::kFull ? "full" : "smoke"; }

int cases(int smoke, int full) { return test_level() == TestLevel::kFull ? full : smoke; }

static std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t seed_for(std::string const& key) {
  std::uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (char c : key) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return splitmix64(global_seed() ^ h);
}

std::uint64_t test_seed() {
  auto const* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return seed_for(info ? std::string(info->test_suite_name()) + "." + info->name() : std::string());
}

std::mt19937_64 test_rng() { return std::mt19937_64(test_seed()); }

}  // namespace fusepack::test
