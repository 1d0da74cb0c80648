// The head sizes the fused gated delta rule runs: K = V, one of GatedDeltaHeadDims. This list is the only statement of
// them: both launchers dispatch over it (the kernels are instantiated for exactly its entries), and their checks and
// the LibTorch op's refusal read it. Plain C++, no CUDA headers: the op checks against it on CPU-only builds too.
#pragma once

#include "kernels/common/static_switch.h"

#include <cstdint>
#include <string>

namespace fusepack {

using GatedDeltaHeadDims = IntList<64, 128>;

// Whether the fused kernels run q/k head dimension K with v head dimension V.
inline bool gated_delta_head_dims_supported(std::int64_t K, std::int64_t V) {
  return K == V && GatedDeltaHeadDims::contains(K);
}

// The refusal of any other pair, naming what runs:
// "the fused kernel supports K = V in {64, 128}; got K=96 (q dimension 2) and V=96 (v dimension 2)".
inline std::string gated_delta_head_dims_refusal(std::int64_t K, std::int64_t V) {
  return "the fused kernel supports K = V in " + GatedDeltaHeadDims::str() + "; got K=" + std::to_string(K) +
         " (q dimension 2) and V=" + std::to_string(V) + " (v dimension 2)";
}

}  // namespace fusepack

// K = V (a run-time int, accepted by gated_delta_head_dims_supported) → compile-time constant NAME.
#define FUSEPACK_GATED_DELTA_HEAD_DIM_SWITCH(dim, NAME, ...) \
  FUSEPACK_INT_SWITCH(::fusepack::GatedDeltaHeadDims, dim, NAME, __VA_ARGS__)
