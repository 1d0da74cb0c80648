// Depthwise causal conv1d over packed examples (the Gated DeltaNet short convolution), on either backend, with
// autograd: y[t, c] = act(Σ_j weight[c, j] · x[t − (W−1) + j, c]) where taps before an example's first token read
// its initial state (or zeros), never the previous example. act = silu when `silu`, the identity otherwise.
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fusepack::ops {

// x: [T, C] channel-last; weight: [C, W] with 1 <= W <= 4 (nn.Conv1d's [C, 1, W] weight squeezed), same dtype and
// device as x; cu_seqlens: int32 [N+1] (0 = cu[0] <= ... <= cu[N] = T); initial_state: optional [N, C, W−1], the W−1
// inputs before each example's first token, oldest first. Returns y [T, C] in x's dtype.
// Composite: per example ATen conv1d (groups = C), any device, autograd by ATen (x, weight, initial_state).
// Fused: CUDA, contiguous, fp32/bf16/fp16, cu_seqlens on x's device, W in 2..4, no initial_state; gradients for x and
// weight, dweight bitwise deterministic. Anything else is refused with the reason; nothing falls back.
at::Tensor conv1d(at::Tensor const& x, at::Tensor const& weight, at::Tensor const& cu_seqlens, bool silu,
                  Backend backend, at::Tensor const& initial_state = {});

// conv1d's y handed out in column parts: part i is y[:, s_i : s_i + widths[i]] as its own contiguous [T, widths[i]]
// tensor (s_i the widths before it), equal to the bit to the columns of conv1d's y; the gradients too. 1..4 widths,
// each >= 0, summing to C. The Gated DeltaNet's q, k and v: the fused kernel writes the parts and its backward reads
// their gradients where they are, so neither the split nor the gradients' concatenation costs a pass over [T, C].
// Composite: conv1d's y, its columns copied out.
std::vector<at::Tensor> conv1d_parts(at::Tensor const& x, at::Tensor const& weight, at::Tensor const& cu_seqlens,
                                     bool silu, std::vector<std::int64_t> const& widths, Backend backend);

}  // namespace fusepack::ops
