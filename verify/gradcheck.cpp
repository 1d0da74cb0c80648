#include "verify/gradcheck.h"

#include <stdexcept>

namespace fusepack::verify {

ref::Tensor finite_difference_gradient(std::function<double()> const& loss, ref::Tensor& x,
                                       FiniteDifferenceOptions const& options) {
  ref::Tensor grad(x.shape());
  double const h = options.step;
  for (ref::Index i = 0; i < x.numel(); ++i) {
    double const saved = x.data()[i];
    x.data()[i] = saved + h;
    double const up = loss();
    x.data()[i] = saved - h;
    double const down = loss();
    x.data()[i] = saved;
    grad.data()[i] = (up - down) / (2 * h);
  }
  return grad;
}

ErrorReport check_gradient(std::string const& name, std::function<double()> const& loss, ref::Tensor& x,
                           ref::Tensor const& analytic, IndexLayout const& layout,
                           FiniteDifferenceOptions const& options) {
  if (analytic.shape() != x.shape()) {
    throw std::invalid_argument("check_gradient " + name + ": gradient shape " + ref::shape_str(analytic.shape()) +
                                " differs from the input's " + ref::shape_str(x.shape()));
  }
  ref::Tensor const numeric = finite_difference_gradient(loss, x, options);
  return compare_allclose(name + " (vs finite differences)", analytic, numeric, options.tol, layout);
}

double dot(ref::Tensor const& a, ref::Tensor const& b) {
  if (a.shape() != b.shape()) {
    throw std::invalid_argument("dot: shapes " + ref::shape_str(a.shape()) + " and " + ref::shape_str(b.shape()));
  }
  return a.flat().dot(b.flat());
}

}  // namespace fusepack::verify
