// Between LibTorch tensors and the fp64 references, for the kernel tests and fusepack-gradcheck: conversions, whether a
// CUDA device can run the fused kernels, and the docs/contracts.md, numerics check of a fused result against the
// reference with the composite as baseline.
#pragma once

#include "reference/tensor.h"
#include "verify/compare.h"
#include "verify/dtype.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace fusepack::verify {

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

}  // namespace fusepack::verify
