// Zero-centred RMSNorm (Qwen3.5 layer norms over hidden, per-head q/k norms over head_dim), fused forward and backward:
//   y = x · rstd · (1 + weight),  rstd = 1 / sqrt(mean(x²) + eps), over the last dimension D of x.
// Numerical contract: x and weight widened to fp32, the sum of squares and every product in fp32, one rounding to
// the output dtype; rstd saved in fp32; dweight summed in fp32 in a fixed order (per-block partial sums, then a
// second kernel), so the backward is bitwise deterministic. The row layout (norm_layout.h) and the dweight reduction
// below are shared with gated_rmsnorm.
#pragma once

#include "kernels/common/dtype.h"
#include "kernels/rmsnorm/norm_layout.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace fusepack {

struct RmsNormFwdParams {
  void const* x = nullptr;       // [rows, dim] contiguous
  void const* weight = nullptr;  // [dim], the checkpoint's w (the gain is 1 + w)
  void* y = nullptr;             // [rows, dim] contiguous
  float* rstd = nullptr;         // [rows] fp32: written by the forward, read by the backward
  std::int64_t rows = 0;
  std::int64_t dim = 0;  // D, <= kNormMaxDim
  float eps = 1e-6f;
  DType dtype = DType::kBF16;  // of x, weight, y (and dy, dx, dweight)
};

struct RmsNormBwdParams : RmsNormFwdParams {
  void const* dy = nullptr;                 // [rows, dim]
  void* dx = nullptr;                       // [rows, dim]
  void* dweight = nullptr;                  // [dim]
  float* dweight_partial = nullptr;         // [num_partials, dim] fp32 workspace, one row of sums per block
  std::int64_t num_partials = 0;            // = rmsnorm_bwd_num_partials(*this)
};

void run_rmsnorm_fwd(RmsNormFwdParams const& p, cudaStream_t stream);
// Rows of the dweight workspace the backward needs on the current device (its persistent grid size).
std::int64_t rmsnorm_bwd_num_partials(RmsNormBwdParams const& p);
void run_rmsnorm_bwd(RmsNormBwdParams const& p, cudaStream_t stream);

// ---- shared by rmsnorm and gated_rmsnorm (with NormRowLayout, norm_layout.h) --------------------------------------

// dweight[c] = Σ_b partial[b, c] over b = 0..num_partials-1 in a fixed order, rounded once to `dtype`.
void run_norm_dweight_reduce(float const* partial, std::int64_t num_partials, std::int64_t dim, void* dweight,
                             DType dtype, cudaStream_t stream);

}  // namespace fusepack
