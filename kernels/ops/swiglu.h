// SwiGLU, y = silu(gate) · up, on either backend, with autograd.
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/core/Tensor.h>

namespace fusepack::ops {

// gate, up: any shape, the same for both, same dtype and device. Fused: CUDA, contiguous, fp32/bf16/fp16.
at::Tensor swiglu(at::Tensor const& gate, at::Tensor const& up, Backend backend);

}  // namespace fusepack::ops
