// Error reports for comparing a result with its fp64 reference, shared by every fusepack test and fusepack-gradcheck:
//   - max abs error, max rel error, relative RMS error;
//   - the worst element (largest share of its tolerance) decoded as (example, position, head, channel) when the
//     caller gives the packed layout;
//   - the share of the tolerance budget used (1.0 = exactly at the tolerance).
// Two tolerances: an elementwise atol + rtol·|ref| (fp64-vs-fp64 checks such as finite differences), and the
// docs/contracts.md, numerics rule for low-precision kernels: max|x − ref64| ≤ 2·max|baseline − ref64| + floor.
#pragma once

#include "reference/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::verify {

// How a flat index of the compared tensor maps back to something a person can find.
struct IndexLayout {
  ref::Shape shape;                      // the compared tensor's shape; empty = report flat indices
  std::vector<std::int32_t> cu_seqlens;  // when given, dimension 0 is the packed token dimension
  std::string decode(std::int64_t flat) const;  // "(example 2, position 5, head 1, channel 7)" or "[3, 1, 7]"
};
IndexLayout packed_layout(ref::Tensor const& t, std::vector<std::int32_t> const& cu_seqlens);
IndexLayout plain_layout(ref::Tensor const& t);

struct Tolerance {
  double atol = 0;
  double rtol = 0;
};

struct ErrorReport {
  std::string name;
  std::int64_t count = 0;
  double max_abs = 0;  // max |x − ref|
  double max_rel = 0;  // max |x − ref| / |ref| over elements with ref ≠ 0
  double rel_rms = 0;  // ||x − ref||₂ / ||ref||₂ (0 when both are 0)
  double ref_max_abs = 0;
  std::int64_t nonfinite = 0;  // elements where x is NaN/inf but ref is finite, or the other way round
  std::int64_t worst = -1;     // flat index with the largest share of its tolerance
  std::string worst_where;
  double worst_got = 0, worst_ref = 0, worst_allowed = 0;
  double budget_used = 0;  // max over elements of |x − ref| / allowed (> 1 fails)
  std::string tolerance;     // how the allowed error was set, for the message
  std::string failed_bound;  // a further bound the caller checked and found broken (empty = none)

  bool passed() const { return nonfinite == 0 && budget_used <= 1.0 && failed_bound.empty(); }
  std::string str() const;  // one line: name, errors, worst element, budget share, PASS/FAIL
};

// Elementwise: allowed_i = atol + rtol·|ref_i|.
ErrorReport compare_allclose(std::string const& name, double const* got, double const* ref, std::int64_t n,
                             Tolerance tol, IndexLayout const& layout = {});
ErrorReport compare_allclose(std::string const& name, ref::Tensor const& got, ref::Tensor const& ref, Tolerance tol,
                             IndexLayout const& layout = {});

// docs/contracts.md, numerics: the error of x against ref64 may be at most twice the error of the unfused baseline
// (same op, same dtype) plus `floor`, one rounding step of the output dtype at the reference's magnitude.
double design_budget(double baseline_max_abs, double floor);
ErrorReport compare_with_baseline(std::string const& name, double const* got, double const* baseline,
                                  double const* ref, std::int64_t n, double floor, IndexLayout const& layout = {});

}  // namespace fusepack::verify
