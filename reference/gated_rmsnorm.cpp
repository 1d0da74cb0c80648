#include "reference/gated_rmsnorm.h"

#include "reference/checks.h"
#include "reference/math.h"

#include <cmath>

namespace fusepack::ref {

static void check_args(std::string const& op, Tensor const& x, Tensor const& z, Tensor const& weight, double eps) {
  if (!x.defined() || x.dim() < 1) fail(op, "x must have at least 1 dimension");
  check_shape(op, "z", z, x.shape());
  check_shape(op, "weight", weight, {x.size(-1)});
  check_positive(op, "eps", eps);
}

Tensor gated_rmsnorm_fwd(Tensor const& x, Tensor const& z, Tensor const& weight, double eps) {
  check_args("gated_rmsnorm_fwd", x, z, weight, eps);
  Index const D = x.size(-1), rows = D ? x.numel() / D : 0;
  Tensor y(x.shape());
  for (Index r = 0; r < rows; ++r) {
    auto xr = x.flat().segment(r * D, D);
    auto zr = z.flat().segment(r * D, D);
    double const rstd = 1.0 / std::sqrt(xr.squaredNorm() / D + eps);
    for (Index i = 0; i < D; ++i) y.flat()[r * D + i] = weight.flat()[i] * xr[i] * rstd * silu(zr[i]);
  }
  return y;
}

// With n = x·rstd and s = silu(z), y = w·n·s. The gate and the weight act elementwise after the norm, so
// dz = dy·w·n·silu'(z), dweight = Σ_rows dy·n·s, and dx is the plain RMSNorm backward of g = dy·w·s:
// dx = rstd·(g − n·mean(g·n)), since d rstd/dx = −rstd³·x/D.
GatedRmsNormGrads gated_rmsnorm_bwd(Tensor const& dy, Tensor const& x, Tensor const& z, Tensor const& weight,
                                    double eps) {
  check_args("gated_rmsnorm_bwd", x, z, weight, eps);
  check_shape("gated_rmsnorm_bwd", "dy", dy, x.shape());
  Index const D = x.size(-1), rows = D ? x.numel() / D : 0;
  GatedRmsNormGrads grads{Tensor(x.shape()), Tensor(x.shape()), Tensor(weight.shape())};
  for (Index r = 0; r < rows; ++r) {
    auto xr = x.flat().segment(r * D, D);
    auto zr = z.flat().segment(r * D, D);
    auto dyr = dy.flat().segment(r * D, D);
    double const rstd = 1.0 / std::sqrt(xr.squaredNorm() / D + eps);
    Eigen::VectorXd const n = xr * rstd;
    Eigen::VectorXd s(D), ds(D);
    for (Index i = 0; i < D; ++i) {
      s[i] = silu(zr[i]);
      ds[i] = silu_grad(zr[i]);
    }
    Eigen::VectorXd const g = dyr.cwiseProduct(weight.flat()).cwiseProduct(s);
    grads.dx.flat().segment(r * D, D) = rstd * (g - n * (g.dot(n) / D));
    grads.dz.flat().segment(r * D, D) = dyr.cwiseProduct(weight.flat()).cwiseProduct(n).cwiseProduct(ds);
    grads.dweight.flat() += dyr.cwiseProduct(n).cwiseProduct(s);
  }
  return grads;
}

}  // namespace fusepack::ref
