// RMSNorm over the last dimension in the two forms Qwen3.5 uses, on either backend, with autograd; both run the same
// fused kernel family (kernels/rmsnorm/), the gate a compile-time flag.
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/core/Tensor.h>

namespace fusepack::ops {

// Zero-centred: y = x / sqrt(mean(x²) + eps) · (1 + weight). The layer norms ([T, hidden]) and per-head q/k norms
// ([T, heads, head_dim]).
// x: [..., D]; weight: [D], the same dtype and device as x (HF stores norm weights in the model dtype); eps > 0.
// Composite: HF's cast points (x.float(), rsqrt, · (1 + w.float()), cast back), any device and dtype.
// Fused: CUDA, contiguous, fp32/bf16/fp16, D <= 8192.
at::Tensor rmsnorm(at::Tensor const& x, at::Tensor const& weight, double eps, Backend backend);

// Gated: y = weight · x / sqrt(mean(x²) + eps) · silu(z) (plain weight). The Gated DeltaNet output norm
// ([T, Hv, head_v_dim]).
// x, z: [..., D], the same shape; weight: [D]; all the same dtype and device; eps > 0.
// Composite: HF's cast points (normalise in fp32, cast, · w in the input dtype, · silu(z.float()), cast back), any
// device and dtype. Fused: CUDA, contiguous, fp32/bf16/fp16, D <= 8192, everything in fp32 with one rounding.
at::Tensor gated_rmsnorm(at::Tensor const& x, at::Tensor const& z, at::Tensor const& weight, double eps,
                         Backend backend);

}  // namespace fusepack::ops
