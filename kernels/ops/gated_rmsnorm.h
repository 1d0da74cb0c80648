// Gated RMSNorm, y = weight · x / sqrt(mean(x²) + eps) · silu(z) over the last dimension (plain weight), on either
// backend, with autograd. The Gated DeltaNet output norm ([T, Hv, head_v_dim]).
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/core/Tensor.h>

namespace fusepack::ops {

// x, z: [..., D], the same shape; weight: [D]; all the same dtype and device; eps > 0.
// Composite: HF's cast points (normalise in fp32, cast, · w in the input dtype, · silu(z.float()), cast back), any
// device and dtype. Fused: CUDA, contiguous, fp32/bf16/fp16, D <= 8192, everything in fp32 with one rounding.
at::Tensor gated_rmsnorm(at::Tensor const& x, at::Tensor const& z, at::Tensor const& weight, double eps,
                         Backend backend);

}  // namespace fusepack::ops
