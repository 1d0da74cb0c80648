// Zero-centred RMSNorm, y = x / sqrt(mean(x²) + eps) · (1 + weight) over the last dimension, on either backend, with
// autograd. The Qwen3.5 layer norms ([T, hidden]) and per-head q/k norms ([T, heads, head_dim]).
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/core/Tensor.h>

namespace fusepack::ops {

// x: [..., D]; weight: [D], the same dtype and device as x (HF stores norm weights in the model dtype); eps > 0.
// Composite: HF's cast points (x.float(), rsqrt, · (1 + w.float()), cast back), any device and dtype.
// Fused: CUDA, contiguous, fp32/bf16/fp16, D <= 8192.
at::Tensor rmsnorm(at::Tensor const& x, at::Tensor const& weight, double eps, Backend backend);

}  // namespace fusepack::ops
