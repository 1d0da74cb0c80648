// Rotary position embedding, NeoX half-split, on the first rotary_dim channels of each head, fp64 reference.
// For channel pairs (i, i + rotary_dim/2), i < rotary_dim/2, with angle a = position_ids[t] · theta^(−2i/rotary_dim):
//   y[i]              = x[i]·cos a − x[i + rotary_dim/2]·sin a
//   y[i + rotary_dim/2] = x[i + rotary_dim/2]·cos a + x[i]·sin a
// Channels rotary_dim..D−1 pass through unchanged. Packed batches restart position_ids at 0 for every example.
#pragma once

#include "reference/tensor.h"

#include <cstdint>
#include <vector>

namespace fusepack::ref {

// x: [T, H, D]; position_ids: [T] (>= 0); rotary_dim: even, 2..D; theta > 0 (Qwen3.5: 1e7, rotary_dim 64 of D 256).
Tensor rope_fwd(Tensor const& x, std::vector<std::int64_t> const& position_ids, Index rotary_dim, double theta);
// The rotation is orthogonal, so dx is dy rotated by −a. Returns dx: [T, H, D].
Tensor rope_bwd(Tensor const& dy, std::vector<std::int64_t> const& position_ids, Index rotary_dim, double theta);

}  // namespace fusepack::ref
