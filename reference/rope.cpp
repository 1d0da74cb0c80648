#include "reference/rope.h"

#include "reference/checks.h"

#include <cmath>
#include <string>

namespace fusepack::ref {

static void check_args(std::string const& op, std::string const& x_name, Tensor const& x,
                       std::vector<std::int64_t> const& position_ids, Index rotary_dim, double theta) {
  check_rank(op, x_name, x, 3);
  Index const T = x.size(0), D = x.size(2);
  if (rotary_dim <= 0 || rotary_dim > D) {
    fail(op, "rotary_dim must be in 2.." + std::to_string(D) + " (the head dim D of " + x_name + " " +
                 shape_str(x.shape()) + "); got " + std::to_string(rotary_dim));
  }
  if (rotary_dim % 2 != 0) fail(op, "rotary_dim must be even; got " + std::to_string(rotary_dim));
  check_positive(op, "theta", theta);
  if (static_cast<Index>(position_ids.size()) != T) {
    fail(op, "position_ids has " + std::to_string(position_ids.size()) + " entries; expected T=" + std::to_string(T) +
                 " (dimension 0 of " + x_name + " " + shape_str(x.shape()) + ")");
  }
  for (size_t t = 0; t < position_ids.size(); ++t) {
    if (position_ids[t] < 0) {
      fail(op, "position_ids must be >= 0; got position_ids[" + std::to_string(t) + "]=" +
                   std::to_string(position_ids[t]));
    }
  }
}

// Rotates the pairs (i, i + rotary_dim/2) of every head of every token by sign · position · theta^(−2i/rotary_dim);
// sign = +1 is the forward, sign = −1 its inverse (and transpose, the rotation being orthogonal).
static Tensor rotate(Tensor const& x, std::vector<std::int64_t> const& position_ids, Index rotary_dim, double theta,
                     double sign) {
  Index const T = x.size(0), H = x.size(1), half = rotary_dim / 2;
  Tensor y = x;  // channels rotary_dim..D−1 pass through
  Eigen::ArrayXd cos_a(half), sin_a(half);
  for (Index t = 0; t < T; ++t) {
    for (Index i = 0; i < half; ++i) {
      double const inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
      double const angle = static_cast<double>(position_ids[t]) * inv_freq;
      cos_a[i] = std::cos(angle);
      sin_a[i] = sign * std::sin(angle);
    }
    for (Index h = 0; h < H; ++h) {
      Eigen::ArrayXd const x1 = x.vec({t, h}).head(half).array(), x2 = x.vec({t, h}).segment(half, half).array();
      y.vec({t, h}).head(half) = (x1 * cos_a - x2 * sin_a).matrix();
      y.vec({t, h}).segment(half, half) = (x2 * cos_a + x1 * sin_a).matrix();
    }
  }
  return y;
}

Tensor rope_fwd(Tensor const& x, std::vector<std::int64_t> const& position_ids, Index rotary_dim, double theta) {
  check_args("rope_fwd", "x", x, position_ids, rotary_dim, theta);
  return rotate(x, position_ids, rotary_dim, theta, +1.0);
}

// y = R(a)·x per pair with R orthogonal, so dx = R(a)ᵀ·dy = R(−a)·dy.
Tensor rope_bwd(Tensor const& dy, std::vector<std::int64_t> const& position_ids, Index rotary_dim, double theta) {
  check_args("rope_bwd", "dy", dy, position_ids, rotary_dim, theta);
  return rotate(dy, position_ids, rotary_dim, theta, -1.0);
}

}  // namespace fusepack::ref
