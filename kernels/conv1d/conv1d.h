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

// A [T, C] tensor held as column parts: channel c is column c − start[i] of part i, a contiguous [T, start[i+1] −
// start[i]] tensor, for the i with start[i] <= c < start[i+1]; 0 = start[0] <= ... <= start[count] = C. One part
// (start {0, C}) is the plain [T, C] layout. The Gated DeltaNet's conv output goes out as its q, k and v this way.
constexpr int kConv1dMaxParts = 4;
struct Conv1dColumnParts {
  void* part[kConv1dMaxParts] = {};
  std::int64_t start[kConv1dMaxParts + 1] = {};
  int count = 0;

  static Conv1dColumnParts whole(void* p, std::int64_t C) {
    Conv1dColumnParts c;
    c.part[0] = p;
    c.start[1] = C;
    c.count = 1;
    return c;
  }
};

struct Conv1dFwdParams {
  void const* x = nullptr;                   // [T, C] channel-last, contiguous
  void const* weight = nullptr;              // [C, W] contiguous; weight[c, W-1] multiplies the current token
  std::int32_t const* cu_seqlens = nullptr;  // [N+1] on the device: 0 = cu[0] <= cu[1] <= ... <= cu[N] = T
  Conv1dColumnParts y;                       // [T, C] channel-last, in column parts
  std::int64_t T = 0, C = 0;
  int W = 4;  // one of Conv1dWidths (conv1d_widths.h)
  int N = 0;  // examples
  bool silu = true;
  DType dtype = DType::kBF16;  // of x, weight, y (and dy, dx, dweight)
};

struct Conv1dBwdParams : Conv1dFwdParams {
  Conv1dColumnParts dy;              // [T, C], in column parts (written through `part`, read only here)
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
