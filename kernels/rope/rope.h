// Rotary position embedding (NeoX half-split) on the first rotary_dim channels of every head, forward and backward.
// Numerical contract: the angle pos · theta^(−2i/rotary_dim) and its sine and cosine in fp64 (an fp32 angle at
// position 8192 is already off by ~5e-4 rad), rounded once to fp32; the rotation in fp32; one rounding to the output
// dtype. Channels rotary_dim..D−1 are copied. The backward is the same kernel rotating dy by −angle.
#pragma once

#include "kernels/common/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace fusepack {

// What both passes share: positions, sizes, the rotation.
struct RopeDims {
  std::int64_t const* position_ids = nullptr;  // [T] int64, any value (packed batches restart at 0 per example)
  std::int64_t T = 0, H = 0, D = 0;            // tokens, heads, head dim
  std::int64_t rotary_dim = 0;                 // even, 2..D
  double theta = 0;                            // > 0 (Qwen3.5: 1e7)
  DType dtype = DType::kBF16;                  // of every activation tensor
};

struct RopeFwdParams : RopeDims {
  void const* x = nullptr;  // [T, H, D] contiguous
  void* y = nullptr;        // [T, H, D] contiguous: x rotated by a (reference/rope.h has the formula)
};

struct RopeBwdParams : RopeDims {
  void const* dy = nullptr;  // [T, H, D] contiguous
  void* dx = nullptr;        // [T, H, D] contiguous, dy rotated by −a (the rotation is orthogonal)
};

void run_rope_fwd(RopeFwdParams const& p, cudaStream_t stream);
void run_rope_bwd(RopeBwdParams const& p, cudaStream_t stream);

}  // namespace fusepack
