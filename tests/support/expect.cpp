#include "tests/support/expect.h"

#include <cstdio>

namespace fusepack::test {

void print_check(ErrorReport const& report) {
  auto const* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("[  check   ] %s.%s | %s\n", info ? info->test_suite_name() : "?", info ? info->name() : "?",
              report.str().c_str());
  std::fflush(stdout);
}

}  // namespace fusepack::test
