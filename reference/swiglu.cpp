#include "reference/swiglu.h"

#include "reference/checks.h"
#include "reference/math.h"

namespace fusepack::ref {

static void check_args(std::string const& op, Tensor const& gate, Tensor const& up) {
  if (!gate.defined()) fail(op, "gate is required but was not given");
  check_shape(op, "up", up, gate.shape());
}

Tensor swiglu_fwd(Tensor const& gate, Tensor const& up) {
  check_args("swiglu_fwd", gate, up);
  Tensor y(gate.shape());
  for (Index i = 0; i < gate.numel(); ++i) y.data()[i] = silu(gate.data()[i]) * up.data()[i];
  return y;
}

// Elementwise product rule: dgate = dy·up·silu'(gate), dup = dy·silu(gate). silu' = σ(x)·(1 + x·(1 − σ(x))) stays
// finite for any |x|: σ saturates to exactly 0 or 1 in fp64 and never divides.
SwiGluGrads swiglu_bwd(Tensor const& dy, Tensor const& gate, Tensor const& up) {
  check_args("swiglu_bwd", gate, up);
  check_shape("swiglu_bwd", "dy", dy, gate.shape());
  SwiGluGrads grads{Tensor(gate.shape()), Tensor(up.shape())};
  for (Index i = 0; i < gate.numel(); ++i) {
    double const g = gate.data()[i];
    grads.dgate.data()[i] = dy.data()[i] * up.data()[i] * silu_grad(g);
    grads.dup.data()[i] = dy.data()[i] * silu(g);
  }
  return grads;
}

}  // namespace fusepack::ref
