// Between LibTorch tensors and the fp64 references, for the kernel tests: conversions, the CUDA-device skip, the
// docs/contracts.md, numerics check of a fused result against the reference with the composite as baseline, and the
// check that a TORCH_CHECK fires with its message.
#pragma once

#include "reference/tensor.h"
#include "tests/support/compare.h"
#include "tests/support/dtype.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>

namespace fusepack::test {

ref::Tensor to_ref(at::Tensor const& t);  // any dtype and device → fp64 on the host, same shape
// Exact when `t` holds values of `dtype` (draw, then round_to(dtype, ...), then convert).
at::Tensor to_torch(ref::Tensor const& t, at::ScalarType dtype, at::Device device);
at::ScalarType scalar_type(Dtype dtype);
Dtype test_dtype(at::ScalarType type);

// Whether a CUDA device can run the fused kernels; when not, `why` says why.
bool cuda_device_available(std::string* why);

// fp32 kernels must also keep ||x − ref||/||ref|| under this. fp32 rounds at 6e-8 relative; the ops accumulate at
// most a few thousand terms, whose rounding errors grow like their square root (≈ 4e-6 at 4096): 1e-5 leaves room
// for that while a wrong formula or a lost term errs by 1e-3 or more.
inline constexpr double kFp32RelRms = 1e-5;

// docs/contracts.md, numerics: max|fused − ref64| <= 2·max|composite − ref64| + one rounding step of the output dtype
// at max|ref64|, and for fp32 runs also rel-RMS <= kFp32RelRms. `composite` is the unfused ATen baseline in the same
// dtype. `run_dtype` is the dtype of the run's inputs when it differs from the output's (an fp32 loss of a bf16 run):
// such an output carries the inputs' rounding, so the fp32 rel-RMS bound does not apply to it.
ErrorReport check_fused(std::string const& name, at::Tensor const& fused, at::Tensor const& composite,
                        ref::Tensor const& ref, IndexLayout const& layout = {},
                        std::optional<Dtype> run_dtype = std::nullopt);

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

}  // namespace fusepack::test

// Skips the current test, with the reason, when no CUDA device can run the fused kernels.
#define FUSEPACK_SKIP_WITHOUT_CUDA()                                        \
  do {                                                                      \
    std::string fusepack_why_;                                              \
    if (!::fusepack::test::cuda_device_available(&fusepack_why_)) {         \
      GTEST_SKIP() << fusepack_why_;                                        \
    }                                                                       \
  } while (0)
