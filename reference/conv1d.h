// Depthwise causal conv1d over packed examples (the Gated DeltaNet short convolution), fp64 reference.
// For token t at position p of its example and channel c, with W = width:
//   y[t, c] = act( Σ_{j=0}^{W−1} weight[c, j] · xe[p − (W−1) + j, c] )
// where xe is the example's own input, preceded by its initial state (or by zeros): taps never reach into the
// previous example. weight[c, W−1] multiplies the current token (nn.Conv1d's weight [C, 1, W] with padding W−1).
// act is silu when `silu` is set, the identity otherwise.
#pragma once

#include "reference/tensor.h"

#include <cstdint>
#include <vector>

namespace fusepack::ref {

struct Conv1dGrads {
  Tensor dx;              // [T, C]
  Tensor dweight;         // [C, W]
  Tensor dinitial_state;  // [N, C, W−1]; defined only when an initial_state was given
};

// x: [T, C] channel-last; weight: [C, W], 1 <= W <= 4; cu_seqlens: [N+1];
// initial_state: optional [N, C, W−1], the W−1 inputs before each example's first token, oldest first.
Tensor conv1d_fwd(Tensor const& x, Tensor const& weight, std::vector<std::int32_t> const& cu_seqlens, bool silu,
                  Tensor const& initial_state = {});
Conv1dGrads conv1d_bwd(Tensor const& dy, Tensor const& x, Tensor const& weight,
                       std::vector<std::int32_t> const& cu_seqlens, bool silu, Tensor const& initial_state = {});

}  // namespace fusepack::ref
