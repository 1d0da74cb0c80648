// main() of every fusepack GoogleTest binary: validates the environment and prints, at the start of every test,
// the seed and level it runs with, so any failure can be replayed with FUSEPACK_SEED=<seed>.
#include "tests/support/env.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <exception>

namespace {

class SeedPrinter : public ::testing::EmptyTestEventListener {
  void OnTestStart(::testing::TestInfo const&) override {
    using namespace fusepack::test;
    std::printf("[   seed   ] FUSEPACK_SEED=%llu FUSEPACK_TEST_LEVEL=%s (this test's seed: %llu)\n",
                static_cast<unsigned long long>(global_seed()), test_level_name(test_level()),
                static_cast<unsigned long long>(test_seed()));
    std::fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    fusepack::test::global_seed();
    fusepack::test::test_level();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "fusepack test: %s\n", e.what());
    return 2;
  }
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedPrinter);
  return RUN_ALL_TESTS();
}
