// SwiGLU of the dense MLP, y = silu(gate) · up, fused forward and backward.
// Numerical contract: inputs widened to fp32, silu and the products in fp32, one rounding to the output dtype.
#pragma once

#include "kernels/common/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace fusepack {

struct SwiGluFwdParams {
  void const* gate = nullptr;  // [n] contiguous
  void const* up = nullptr;    // [n] contiguous
  void* y = nullptr;           // [n] contiguous
  std::int64_t n = 0;
  DType dtype = DType::kBF16;  // of every tensor
};

struct SwiGluBwdParams : SwiGluFwdParams {
  void const* dy = nullptr;  // [n]
  void* dgate = nullptr;     // [n]
  void* dup = nullptr;       // [n]
};

void run_swiglu_fwd(SwiGluFwdParams const& p, cudaStream_t stream);
void run_swiglu_bwd(SwiGluBwdParams const& p, cudaStream_t stream);

}  // namespace fusepack
