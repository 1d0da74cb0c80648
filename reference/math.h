// Scalar functions shared by the references, with their derivatives, in fp64.
#pragma once

#include <cmath>

namespace fusepack::ref {

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x * sigmoid(x); }
// d silu / dx = σ(x)·(1 + x·(1 − σ(x)))
inline double silu_grad(double x) {
  double const s = sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}
inline double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

}  // namespace fusepack::ref
