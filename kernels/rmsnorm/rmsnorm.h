// RMSNorm over the last dimension D of x, fused forward and backward, in the two forms Qwen3.5 uses:
//   plain (z == nullptr): y = x · rstd · (1 + weight)            the zero-centred layer norms and per-head q/k norms;
//   gated (z given):      y = x · rstd · weight · silu(z)        the Gated DeltaNet output norm (plain weight);
// rstd = 1 / sqrt(mean(x²) + eps). One kernel family: the gate is a compile-time flag of the same row kernels.
// Numerical contract: every input widened to fp32, the sum of squares and every product in fp32, one rounding to the
// output dtype (HF's gated norm rounds twice more on the way; this is the more exact of the two, as FLA's
// FusedRMSNormGated); rstd saved in fp32; dweight summed in fp32 in a fixed order (per-block partial sums, then a
// second kernel), so the backward is bitwise deterministic. Row layout: norm_layout.h.
#pragma once

#include "kernels/common/dtype.h"
#include "kernels/rmsnorm/norm_layout.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace fusepack {

struct RmsNormFwdParams {
  void const* x = nullptr;       // [rows, dim] contiguous
  void const* z = nullptr;       // [rows, dim] contiguous, the gate; nullptr: the plain form
  void const* weight = nullptr;  // [dim], the checkpoint's w (plain form: the gain is 1 + w; gated: w)
  void* y = nullptr;             // [rows, dim] contiguous
  float* rstd = nullptr;         // [rows] fp32: written by the forward, read by the backward
  std::int64_t rows = 0;
  std::int64_t dim = 0;  // D, <= kNormMaxDim
  float eps = 1e-6f;
  DType dtype = DType::kBF16;  // of x, z, weight, y (and dy, dx, dz, dweight)
};

struct RmsNormBwdParams : RmsNormFwdParams {
  void const* dy = nullptr;          // [rows, dim]
  void* dx = nullptr;                // [rows, dim]
  void* dz = nullptr;                // [rows, dim], gated form only (required with z: run_rmsnorm_bwd throws without)
  void* dweight = nullptr;           // [dim]
  float* dweight_partial = nullptr;  // [num_partials, dim] fp32 workspace, one row of sums per block
  std::int64_t num_partials = 0;     // = rmsnorm_bwd_num_partials(*this)
};

void run_rmsnorm_fwd(RmsNormFwdParams const& p, cudaStream_t stream);
// Rows of the dweight workspace the backward needs on the current device (its persistent grid size).
std::int64_t rmsnorm_bwd_num_partials(RmsNormBwdParams const& p);
void run_rmsnorm_bwd(RmsNormBwdParams const& p, cudaStream_t stream);

}  // namespace fusepack
