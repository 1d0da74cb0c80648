// at::ScalarType → the kernels' DType (fp32, bf16, fp16), for the fused paths.
#pragma once

#include "kernels/common/dtype.h"

#include <ATen/core/Tensor.h>

namespace fusepack::ops {

inline DType kernel_dtype(at::Tensor const& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kF32;
    case at::kBFloat16: return DType::kBF16;
    case at::kHalf: return DType::kF16;
    default: break;
  }
  TORCH_CHECK(false, "no fused kernel dtype for ", t.scalar_type(), " (fp32, bf16 and fp16 are supported)");
}

}  // namespace fusepack::ops
