// Rotary position embedding (NeoX half-split, partial: the first rotary_dim channels of each head), on either
// backend, with autograd.
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fusepack::ops {

// x: [T, H, D]; position_ids: int64 [T] on x's device (packed batches restart at 0 for every example);
// rotary_dim: even, 2..D (Qwen3.5: 64 of D = 256); theta > 0 (Qwen3.5: 1e7). Returns y: [T, H, D], x's dtype.
// Composite: HF's computation (inv_freq, angles, cos and sin in fp32 — fp64 for fp64 x — cos/sin cast to x's
// dtype, x·cos + rotate_half(x)·sin). Fused: CUDA, contiguous x, fp32/bf16/fp16; angles in fp64 on the device.
at::Tensor rope(at::Tensor const& x, at::Tensor const& position_ids, int64_t rotary_dim, double theta, Backend backend);

}  // namespace fusepack::ops
