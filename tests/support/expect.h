// GoogleTest glue for ErrorReport (verify/compare.h): every checked report is printed as one "[ check ]" line
// (ci/summarize.py collects them into the gate's summary table) and fails the test, with the report as message, when
// over its budget.
#pragma once

#include "tests/support/verify.h"
#include "verify/compare.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace fusepack::test {

void print_check(ErrorReport const& report);

}  // namespace fusepack::test

#define FUSEPACK_EXPECT_PASS(report_expr)                                   \
  do {                                                                      \
    ::fusepack::verify::ErrorReport const fusepack_report_ = (report_expr); \
    ::fusepack::test::print_check(fusepack_report_);                        \
    EXPECT_TRUE(fusepack_report_.passed()) << fusepack_report_.str();       \
  } while (0)

// `statement` must throw std::invalid_argument whose message contains `substring` (the message is printed, so a
// reader of the test log sees what a user would see).
#define FUSEPACK_EXPECT_INVALID_ARGUMENT(statement, substring)                                        \
  do {                                                                                                \
    try {                                                                                             \
      statement;                                                                                      \
      ADD_FAILURE() << "expected std::invalid_argument containing '" << (substring) << "' from "      \
                    << #statement;                                                                    \
    } catch (std::invalid_argument const& fusepack_e_) {                                              \
      std::printf("[  error   ] %s\n", fusepack_e_.what());                                           \
      EXPECT_NE(std::string(fusepack_e_.what()).find(substring), std::string::npos)                   \
          << "message: " << fusepack_e_.what();                                                       \
    }                                                                                                 \
  } while (0)
