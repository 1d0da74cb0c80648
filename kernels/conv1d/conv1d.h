// Depthwise causal conv1d over packed examples (the Gated DeltaNet short convolution), fused forward and backward.
// Numerical contract: inputs and weights widened to fp32, taps summed in fp32 in tap order (oldest first), SiLU in
// fp32, one rounding to the output dtype; dweight summed in fp32 in a fixed order, so the backward is bitwise
// deterministic. Taps that fall before an example's first token read zero: no example ever sees another's tokens.
#pragma once

#include "kernels/common/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fusepack {

struct Conv1dFwdParams {
  void const* x = nullptr;                   // [T, C] channel-last, contiguous
  void const* weight = nullptr;              // [C, W] contiguous; weight[c, W-1] multiplies the current token
  std::int32_t const* cu_seqlens = nullptr;  // [N+1] on the device: 0 = cu[0] <= cu[1] <= ... <= cu[N] = T
  void* y = nullptr;                         // [T, C] channel-last, contiguous
  std::int64_t T = 0, C = 0;
  int W = 4;  // one of Conv1dWidths (conv1d_widths.h)
  int N = 0;  // examples
  bool silu = true;
  DType dtype = DType::kBF16;  // of x, weight, y (and dy, dx, dweight)
};

struct Conv1dBwdParams : Conv1dFwdParams {
  void const* dy = nullptr;          // [T, C]
  void* dx = nullptr;                // [T, C]
  void* dweight = nullptr;           // [C, W]
  float* dweight_partial = nullptr;  // [conv1d_bwd_num_partials(p), C, W] fp32 workspace, 16-byte aligned
};

void run_conv1d_fwd(Conv1dFwdParams const& p, cudaStream_t stream);
// Rows of the fp32 dweight workspace the backward needs (a function of T only, so the reduction order, and
// with it every bit of dweight, is the same on every run).
std::int64_t conv1d_bwd_num_partials(Conv1dBwdParams const& p);
void run_conv1d_bwd(Conv1dBwdParams const& p, cudaStream_t stream);

}  // namespace fusepack
