#include "properties/check.h"

#include "tests/support/env.h"

#include <gtest/gtest.h>
#include <rapidcheck/detail/TestListenerAdapter.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <unordered_map>

namespace fusepack::props {
namespace {

// Whether RC_PARAMS names `key` (its format is "key=value key2=value2 ...", see RapidCheck's configuration docs).
bool rc_params_set(std::string const& key) {
  char const* env = std::getenv("RC_PARAMS");
  if (!env) return false;
  std::istringstream in(env);
  std::string item;
  while (in >> item) {
    if (item.compare(0, key.size() + 1, key + "=") == 0) return true;
  }
  return false;
}

struct RunInfo {
  rc::detail::TestMetadata metadata;
  rc::detail::TestParams params;
};

RunInfo run_info(char const* kind, CaseCounts counts) {
  auto const* test = ::testing::UnitTest::GetInstance()->current_test_info();
  RunInfo info;
  // The id GoogleTest's own RapidCheck integration uses, so RC_PARAMS="reproduce=..." strings keep working.
  info.metadata.id = std::string(test->test_suite_name()) + "/" + test->name();
  info.metadata.description = test->name();
  info.params = rc::detail::configuration().testParams;
  bool const own_seed = !rc_params_set("seed");
  bool const own_cases = !rc_params_set("max_success");
  if (own_seed) info.params.seed = test::test_seed();
  if (own_cases) info.params.maxSuccess = test::cases(counts.smoke, counts.full);
  std::printf("[rapidcheck] %s %s: seed=%llu (%s) max_success=%d (%s) max_size=%d%s\n", kind, info.metadata.id.c_str(),
              static_cast<unsigned long long>(info.params.seed),
              own_seed ? "from FUSEPACK_SEED and the test name" : "from RC_PARAMS", info.params.maxSuccess,
              own_cases ? test::test_level_name(test::test_level()) : "from RC_PARAMS", info.params.maxSize,
              info.params.disableShrinking ? " noshrink" : "");
  std::printf("[rapidcheck] replay: RC_PARAMS=\"seed=%llu max_success=%d\" --gtest_filter='%s.%s'\n",
              static_cast<unsigned long long>(info.params.seed), info.params.maxSuccess, test->test_suite_name(),
              test->name());
  std::fflush(stdout);
  return info;
}

// RapidCheck's failure description reads "<file>:<line>:\nRC_FAIL(<expression>)\n\n<message>"; the expression line
// is the same for every FUSEPACK_RC_REQUIRE, so it is left out.
std::string failure_str(std::string const& description) {
  std::size_t const expr = description.find("\nRC_FAIL(");
  std::size_t const message = description.find("\n\n", expr == std::string::npos ? 0 : expr);
  if (expr == std::string::npos || message == std::string::npos) return description;
  return description.substr(0, expr) + " " + description.substr(message + 2);
}

std::string counterexample_str(rc::detail::FailureResult const& failure) {
  std::ostringstream os;
  for (auto const& [type, value] : failure.counterExample) os << "    " << type << ": " << value << "\n";
  return os.str();
}

}  // namespace

void check_rc_property(rc::detail::Property const& property, CaseCounts counts) {
  RunInfo const info = run_info("property", counts);
  // RapidCheck's default listener: it prints the RC_PARAMS="reproduce=..." line for failures at exit.
  rc::detail::TestResult const result = rc::detail::checkProperty(property, info.metadata, info.params);
  rc::detail::SuccessResult success;
  if (result.match(success)) {
    std::printf("[rapidcheck] OK: %d cases passed\n", success.numSuccess);
    // The RC_CLASSIFY tags: how often each kind of case came up.
    for (auto const& [tags, count] : success.distribution) {
      std::string joined;
      for (std::string const& tag : tags) joined += (joined.empty() ? "" : ", ") + tag;
      std::printf("[rapidcheck]   %5.1f%% %s\n", 100.0 * count / std::max(success.numSuccess, 1), joined.c_str());
    }
    return;
  }
  std::ostringstream os;
  rc::detail::printResultMessage(result, os);
  FAIL() << os.str();
}

void check_rc_planted(std::string const& bug, rc::detail::Property const& property, CaseCounts counts) {
  RunInfo const info = run_info("planted bug", counts);
  // A silent listener and no reproduce map: finding the planted bug is the expected outcome, not a failure to report.
  rc::detail::TestListenerAdapter quiet;
  rc::detail::TestResult const result = rc::detail::checkProperty(
      property, info.metadata, info.params, quiet, std::unordered_map<std::string, rc::detail::Reproduce>{});
  rc::detail::FailureResult failure;
  rc::detail::SuccessResult success;
  if (result.match(failure)) {
    std::printf("[ planted  ] %s: CAUGHT after %d passing case%s; shrunk counterexample:\n%s    failure: %s\n",
                bug.c_str(), failure.numSuccess, failure.numSuccess == 1 ? "" : "s",
                counterexample_str(failure).c_str(), failure_str(failure.description).c_str());
    std::fflush(stdout);
    return;
  }
  if (result.match(success)) {
    FAIL() << "planted bug '" << bug << "' was NOT caught in " << success.numSuccess
           << " cases: the property is too weak to count (docs/contracts.md, no leakage)";
  }
  std::ostringstream os;
  rc::detail::printResultMessage(result, os);
  FAIL() << "planted bug '" << bug << "': RapidCheck did not run to a verdict: " << os.str();
}

}  // namespace fusepack::props
