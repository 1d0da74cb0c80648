// Finite-difference gradient checks for the fp64 references: every element of an input is perturbed by ±step and
// the central difference of a scalar loss is compared with the hand-written backward.
//
// Tolerance (default atol = rtol = 1e-6): in fp64 with step h = 1e-5 the central difference errs by the truncation
// term h²/6·|f'''| ≈ 2e-11·|f'''| plus rounding 2^-52·|L|/h ≈ 2e-11·|L|; with O(1) inputs and losses below ~1e3
// both stay under 1e-7, so 1e-6 keeps an order of magnitude of margin, while a wrong or missing term in a backward
// errs by O(1e-2) or more (tests/support/support_test.cpp plants such a bug and checks that it is caught).
#pragma once

#include "reference/tensor.h"
#include "verify/compare.h"

#include <functional>
#include <string>

namespace fusepack::verify {

struct FiniteDifferenceOptions {
  double step = 1e-5;
  Tolerance tol{1e-6, 1e-6};
};

// d loss / d x by central differences; x is perturbed in place and restored exactly.
ref::Tensor finite_difference_gradient(std::function<double()> const& loss, ref::Tensor& x,
                                       FiniteDifferenceOptions const& options = {});

// Compares `analytic` (the backward's d loss / d x) with the central differences of `loss` w.r.t. x.
ErrorReport check_gradient(std::string const& name, std::function<double()> const& loss, ref::Tensor& x,
                           ref::Tensor const& analytic, IndexLayout const& layout = {},
                           FiniteDifferenceOptions const& options = {});

// Σ a·b over all elements: the scalar loss <dy, y> whose gradient w.r.t. y is dy.
double dot(ref::Tensor const& a, ref::Tensor const& b);

}  // namespace fusepack::verify
