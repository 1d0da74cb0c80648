#include "reference/rmsnorm.h"

#include "reference/checks.h"

#include <cmath>

namespace fusepack::ref {

static void check_args(std::string const& op, Tensor const& x, Tensor const& weight, double eps) {
  if (!x.defined() || x.dim() < 1) fail(op, "x must have at least 1 dimension");
  check_shape(op, "weight", weight, {x.size(-1)});
  check_positive(op, "eps", eps);
}

Tensor rmsnorm_fwd(Tensor const& x, Tensor const& weight, double eps) {
  check_args("rmsnorm_fwd", x, weight, eps);
  Index const D = x.size(-1), rows = D ? x.numel() / D : 0;
  Tensor y(x.shape());
  for (Index r = 0; r < rows; ++r) {
    auto xr = x.flat().segment(r * D, D);
    double const rstd = 1.0 / std::sqrt(xr.squaredNorm() / D + eps);
    y.flat().segment(r * D, D) = (xr * rstd).cwiseProduct((1.0 + weight.flat().array()).matrix());
  }
  return y;
}

// With n = x·rstd and g = dy·(1+w): dx = rstd·(g − n·mean(g·n)), since d rstd/dx = −rstd³·x/D.
RmsNormGrads rmsnorm_bwd(Tensor const& dy, Tensor const& x, Tensor const& weight, double eps) {
  check_args("rmsnorm_bwd", x, weight, eps);
  check_shape("rmsnorm_bwd", "dy", dy, x.shape());
  Index const D = x.size(-1), rows = D ? x.numel() / D : 0;
  RmsNormGrads grads{Tensor(x.shape()), Tensor(weight.shape())};
  for (Index r = 0; r < rows; ++r) {
    auto xr = x.flat().segment(r * D, D);
    auto dyr = dy.flat().segment(r * D, D);
    double const rstd = 1.0 / std::sqrt(xr.squaredNorm() / D + eps);
    Eigen::VectorXd const n = xr * rstd;
    Eigen::VectorXd const g = dyr.cwiseProduct((1.0 + weight.flat().array()).matrix());
    grads.dx.flat().segment(r * D, D) = rstd * (g - n * (g.dot(n) / D));
    grads.dweight.flat() += dyr.cwiseProduct(n);
  }
  return grads;
}

}  // namespace fusepack::ref
