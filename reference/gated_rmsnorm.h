// Gated RMSNorm (the Gated DeltaNet output norm; plain weight, not zero-centred), fp64 reference:
//   y = weight · x / sqrt(mean(x^2) + eps) · silu(z), normalised over the last dimension (head_v_dim).
#pragma once

#include "reference/tensor.h"

namespace fusepack::ref {

struct GatedRmsNormGrads {
  Tensor dx;       // shape of x
  Tensor dz;       // shape of z (= shape of x)
  Tensor dweight;  // [D]
};

// x, z: [..., D] with the same shape ([T, Hv, head_v_dim] in the model); weight: [D].
Tensor gated_rmsnorm_fwd(Tensor const& x, Tensor const& z, Tensor const& weight, double eps);
GatedRmsNormGrads gated_rmsnorm_bwd(Tensor const& dy, Tensor const& x, Tensor const& z, Tensor const& weight,
                                    double eps);

}  // namespace fusepack::ref
