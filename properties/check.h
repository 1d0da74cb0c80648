// Running RapidCheck properties as GoogleTest tests, with fusepack's seeds and levels:
//   - the seed is FUSEPACK_SEED mixed with the test's name (tests/support/env.h test_seed()), unless RC_PARAMS sets
//     seed=...; the number of cases is kSmokeCases at FUSEPACK_TEST_LEVEL=smoke and kFullCases at full (or the
//     caller's CaseCounts), unless RC_PARAMS sets max_success=...; other RC_PARAMS keys (max_size, noshrink,
//     reproduce, ...) apply as usual.
//     Every test prints the values it runs with.
//   - check_property() fails the test with RapidCheck's shrunk counterexample when the property fails;
//   - check_planted() runs a property against a deliberately leaky variant and fails the test unless RapidCheck finds
//     a counterexample; it prints the shrunk counterexample (a property counts only if it can fail:
//     docs/contracts.md, no leakage).
#pragma once

#include <rapidcheck.h>

#include <string>
#include <utility>

namespace fusepack::props {

inline constexpr int kSmokeCases = 100;
inline constexpr int kFullCases = 1000;

// How many cases a property runs at each test level (RC_PARAMS max_success=... overrides both).
struct CaseCounts {
  int smoke = kSmokeCases;
  int full = kFullCases;
};

void check_rc_property(rc::detail::Property const& property, CaseCounts counts);
void check_rc_planted(std::string const& bug, rc::detail::Property const& property, CaseCounts counts);

// `testable` is a callable without arguments that draws its inputs with *generator and asserts with RC_ASSERT.
template <class Testable>
void check_property(Testable&& testable, CaseCounts counts = {}) {
  check_rc_property(rc::detail::toProperty(std::forward<Testable>(testable)), counts);
}

template <class Testable>
void check_planted(std::string const& bug, Testable&& testable, CaseCounts counts = {}) {
  check_rc_planted(bug, rc::detail::toProperty(std::forward<Testable>(testable)), counts);
}

}  // namespace fusepack::props
