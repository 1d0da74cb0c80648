#include "verify/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace fusepack::verify {

std::string IndexLayout::decode(std::int64_t flat) const {
  std::ostringstream os;
  if (shape.empty()) {
    os << "flat index " << flat;
    return os.str();
  }
  std::vector<std::int64_t> idx(shape.size());
  std::int64_t rest = flat;
  for (size_t d = shape.size(); d-- > 0;) {
    std::int64_t const s = std::max<std::int64_t>(shape[d], 1);
    idx[d] = rest % s;
    rest /= s;
  }
  if (cu_seqlens.size() >= 2) {
    auto const t = static_cast<std::int32_t>(idx[0]);
    auto const it = std::upper_bound(cu_seqlens.begin(), cu_seqlens.end(), t);
    auto const example = std::max<std::int64_t>(0, (it - cu_seqlens.begin()) - 1);
    os << "(example " << example << ", position " << (t - cu_seqlens[example]);
    static char const* names3[] = {"head", "channel"};
    for (size_t d = 1; d < idx.size(); ++d) {
      char const* name = idx.size() == 2 ? "channel" : idx.size() == 3 ? names3[d - 1] : "dim";
      os << ", " << name;
      if (idx.size() > 3) os << d;
      os << ' ' << idx[d];
    }
    os << ')';
  } else {
    os << '[';
    for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
    os << ']';
  }
  return os.str();
}

IndexLayout packed_layout(ref::Tensor const& t, std::vector<std::int32_t> const& cu_seqlens) {
  return {t.shape(), cu_seqlens};
}
IndexLayout plain_layout(ref::Tensor const& t) { return {t.shape(), {}}; }

template <typename Allowed>
static ErrorReport compare_impl(std::string const& name, double const* got, double const* ref, std::int64_t n,
                                Allowed allowed, std::string tolerance, IndexLayout const& layout) {
  ErrorReport r;
  r.name = name;
  r.count = n;
  r.tolerance = std::move(tolerance);
  double err2 = 0, ref2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double const x = got[i], y = ref[i];
    if (std::isfinite(x) != std::isfinite(y)) {
      if (r.nonfinite++ == 0) {
        r.worst = i;
        r.worst_got = x;
        r.worst_ref = y;
        r.worst_allowed = allowed(i, y);
        r.budget_used = std::numeric_limits<double>::infinity();
      }
      continue;
    }
    if (!std::isfinite(x)) continue;  // both non-finite
    double const e = std::fabs(x - y);
    r.max_abs = std::max(r.max_abs, e);
    if (y != 0) r.max_rel = std::max(r.max_rel, e / std::fabs(y));
    r.ref_max_abs = std::max(r.ref_max_abs, std::fabs(y));
    err2 += e * e;
    ref2 += y * y;
    double const a = allowed(i, y);
    double const share = e == 0 ? 0.0 : (a > 0 ? e / a : std::numeric_limits<double>::infinity());
    if (r.nonfinite == 0 && (r.worst < 0 || share > r.budget_used)) {
      r.budget_used = share;
      r.worst = i;
      r.worst_got = x;
      r.worst_ref = y;
      r.worst_allowed = a;
    }
  }
  r.rel_rms = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  if (r.worst >= 0) r.worst_where = layout.decode(r.worst);
  return r;
}

ErrorReport compare_allclose(std::string const& name, double const* got, double const* ref, std::int64_t n,
                             Tolerance tol, IndexLayout const& layout) {
  std::ostringstream t;
  t << "atol " << tol.atol << " + rtol " << tol.rtol << "·|ref|";
  return compare_impl(
      name, got, ref, n, [&](std::int64_t, double y) { return tol.atol + tol.rtol * std::fabs(y); }, t.str(), layout);
}

ErrorReport compare_allclose(std::string const& name, ref::Tensor const& got, ref::Tensor const& ref, Tolerance tol,
                             IndexLayout const& layout) {
  if (got.shape() != ref.shape()) {
    throw std::invalid_argument("compare " + name + ": shape " + ref::shape_str(got.shape()) +
                                " does not match the reference's " + ref::shape_str(ref.shape()));
  }
  return compare_allclose(name, got.data(), ref.data(), got.numel(), tol,
                          layout.shape.empty() ? plain_layout(got) : layout);
}

double design_budget(double baseline_max_abs, double floor) { return 2.0 * baseline_max_abs + floor; }

ErrorReport compare_with_baseline(std::string const& name, double const* got, double const* baseline,
                                  double const* ref, std::int64_t n, double floor, IndexLayout const& layout) {
  double baseline_err = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::isfinite(baseline[i]) && std::isfinite(ref[i])) {
      baseline_err = std::max(baseline_err, std::fabs(baseline[i] - ref[i]));
    }
  }
  double const budget = design_budget(baseline_err, floor);
  std::ostringstream t;
  t << "2·baseline " << baseline_err << " + floor " << floor;
  return compare_impl(name, got, ref, n, [&](std::int64_t, double) { return budget; }, t.str(), layout);
}

std::string ErrorReport::str() const {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s %s: max_abs %.3g max_rel %.3g rel_rms %.3g over %lld values; budget used %.3g%%",
                passed() ? "PASS" : "FAIL", name.c_str(), max_abs, max_rel, rel_rms, static_cast<long long>(count),
                100.0 * budget_used);
  std::string s = buf;
  if (worst >= 0) {
    std::snprintf(buf, sizeof buf, " (worst at %s: got %.9g, ref %.9g, allowed %.3g)", worst_where.c_str(),
                  worst_got, worst_ref, worst_allowed);
    s += buf;
  }
  if (nonfinite) s += "; " + std::to_string(nonfinite) + " non-finite mismatches";
  s += "; tolerance " + tolerance;
  if (!failed_bound.empty()) s += "; FAILED " + failed_bound;
  return s;
}

}  // namespace fusepack::verify
