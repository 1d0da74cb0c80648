// Gated RMSNorm (the Gated DeltaNet output norm over head_v_dim; plain weight, not zero-centred), fused forward and
// backward:  y = weight · x · rstd · silu(z),  rstd = 1 / sqrt(mean(x²) + eps), over the last dimension D.
// Numerical contract: x, z and weight widened to fp32, the sum of squares and every product in fp32, one rounding to
// the output dtype (HF rounds x·rstd and weight·(x·rstd) to the model dtype first; this is the more exact of the
// two, as FLA's FusedRMSNormGated); rstd saved in fp32; dweight summed in fp32 in a fixed order, so the backward is
// bitwise deterministic. Row layout and dweight reduction: kernels/rmsnorm/rmsnorm.h.
#pragma once

#include "kernels/common/dtype.h"
#include "kernels/rmsnorm/rmsnorm.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace fusepack {

struct GatedRmsNormFwdParams {
  void const* x = nullptr;       // [rows, dim] contiguous (rows = T · Hv in the model, dim = head_v_dim)
  void const* z = nullptr;       // [rows, dim] contiguous, the gate
  void const* weight = nullptr;  // [dim]
  void* y = nullptr;             // [rows, dim] contiguous
  float* rstd = nullptr;         // [rows] fp32: written by the forward, read by the backward
  std::int64_t rows = 0;
  std::int64_t dim = 0;  // D, <= kNormMaxDim
  float eps = 1e-6f;
  DType dtype = DType::kBF16;  // of x, z, weight, y (and dy, dx, dz, dweight)
};

struct GatedRmsNormBwdParams : GatedRmsNormFwdParams {
  void const* dy = nullptr;          // [rows, dim]
  void* dx = nullptr;                // [rows, dim]
  void* dz = nullptr;                // [rows, dim]
  void* dweight = nullptr;           // [dim]
  float* dweight_partial = nullptr;  // [num_partials, dim] fp32 workspace, one row of sums per block
  std::int64_t num_partials = 0;     // = gated_rmsnorm_bwd_num_partials(*this)
};

void run_gated_rmsnorm_fwd(GatedRmsNormFwdParams const& p, cudaStream_t stream);
// Rows of the dweight workspace the backward needs on the current device (its persistent grid size).
std::int64_t gated_rmsnorm_bwd_num_partials(GatedRmsNormBwdParams const& p);
void run_gated_rmsnorm_bwd(GatedRmsNormBwdParams const& p, cudaStream_t stream);

}  // namespace fusepack
