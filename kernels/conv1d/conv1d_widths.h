// The filter widths the fused conv1d runs: W, one of Conv1dWidths. This list is the only statement of them: both
// launchers dispatch over it (the kernels are instantiated for exactly its entries), and the LibTorch op's check and
// refusal read it. Plain C++, no CUDA headers: the op checks against it on CPU-only builds too.
#pragma once

#include "kernels/common/static_switch.h"

#include <cstdint>
#include <string>

namespace fusepack {

using Conv1dWidths = IntList<2, 3, 4>;

// Whether the fused kernels run width W.
inline bool conv1d_width_supported(std::int64_t W) { return Conv1dWidths::contains(W); }

// The refusal of any other width, naming what runs: "the fused kernel supports width W in 2..4; got W=1".
inline std::string conv1d_width_refusal(std::int64_t W) {
  return "the fused kernel supports width W in " + Conv1dWidths::range_str() + "; got W=" + std::to_string(W);
}

}  // namespace fusepack
