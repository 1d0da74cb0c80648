// Zero-centred RMSNorm (Qwen3.5 layer norms and per-head q/k norms), fp64 reference:
//   y = x / sqrt(mean(x^2) + eps) * (1 + weight), normalised over the last dimension of x.
#pragma once

#include "reference/tensor.h"

namespace fusepack::ref {

struct RmsNormGrads {
  Tensor dx;       // shape of x
  Tensor dweight;  // [D]
};

// x: [..., D] (any leading dimensions: [T, hidden] for layer norms, [T, H, head_dim] for q/k norms); weight: [D].
Tensor rmsnorm_fwd(Tensor const& x, Tensor const& weight, double eps);
RmsNormGrads rmsnorm_bwd(Tensor const& dy, Tensor const& x, Tensor const& weight, double eps);

}  // namespace fusepack::ref
