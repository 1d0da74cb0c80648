// The tests' view of verify/ (the shipped comparison helpers, fusepack::verify): included by the tests/support headers
// every test includes, so tests keep calling randn, compare_allclose, Dtype, to_torch, ... unqualified.
#pragma once

namespace fusepack::verify {}

// Tests are written inside fusepack::test and name the verify/ helpers without a namespace.
namespace fusepack::test {
using namespace ::fusepack::verify;
}  // namespace fusepack::test
