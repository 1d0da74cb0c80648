// GoogleTest glue for the LibTorch tests, over verify/torch_bridge.h (conversions, the CUDA-device check, the
// docs/contracts.md, numerics check of a fused result): the CUDA-device skip, the check that a TORCH_CHECK fires
// with its message, and deterministic algorithms for one scope.
#pragma once

#include "tests/support/verify.h"
#include "verify/torch_bridge.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace fusepack::test {

// `statement` must throw c10::Error whose message contains `substring`; the message is printed.
template <typename F>
void expect_torch_error(F&& statement, std::string const& substring) {
  try {
    statement();
    ADD_FAILURE() << "expected c10::Error containing '" << substring << "'";
  } catch (c10::Error const& e) {
    std::string const msg = e.what_without_backtrace();
    std::printf("[  error   ] %s\n", msg.c_str());
    EXPECT_NE(msg.find(substring), std::string::npos) << "message: " << msg;
  }
}

// at::globalContext().deterministicAlgorithms() on for one scope: FlashAttention-2 then accumulates dq in per-split
// buffers summed in a fixed order instead of with fp32 atomics, so its backward is reproducible bit for bit.
class DeterministicAlgorithms {
 public:
  DeterministicAlgorithms()
      : was_on_(at::globalContext().deterministicAlgorithms()),
        was_warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  ~DeterministicAlgorithms() { at::globalContext().setDeterministicAlgorithms(was_on_, was_warn_only_); }
  DeterministicAlgorithms(DeterministicAlgorithms const&) = delete;
  DeterministicAlgorithms& operator=(DeterministicAlgorithms const&) = delete;

 private:
  bool was_on_, was_warn_only_;
};

}  // namespace fusepack::test

// Skips the current test, with the reason, when no CUDA device can run the fused kernels.
#define FUSEPACK_SKIP_WITHOUT_CUDA()                                        \
  do {                                                                      \
    std::string fusepack_why_;                                              \
    if (!::fusepack::verify::cuda_device_available(&fusepack_why_)) {       \
      GTEST_SKIP() << fusepack_why_;                                        \
    }                                                                       \
  } while (0)
