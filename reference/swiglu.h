// SwiGLU activation of the dense MLP, fp64 reference: y = silu(gate) · up, elementwise.
#pragma once

#include "reference/tensor.h"

namespace fusepack::ref {

struct SwiGluGrads {
  Tensor dgate;  // shape of gate
  Tensor dup;    // shape of up
};

// gate, up: any shape, the same for both ([T, intermediate] in the model).
Tensor swiglu_fwd(Tensor const& gate, Tensor const& up);
SwiGluGrads swiglu_bwd(Tensor const& dy, Tensor const& gate, Tensor const& up);

}  // namespace fusepack::ref
