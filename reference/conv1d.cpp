#include "reference/conv1d.h"

#include "reference/checks.h"
#include "reference/math.h"

#include <string>

namespace fusepack::ref {

static void check_args(std::string const& op, Tensor const& x, Tensor const& weight,
                       std::vector<std::int32_t> const& cu_seqlens, Tensor const& initial_state) {
  check_rank(op, "x", x, 2);
  Index const T = x.size(0), C = x.size(1);
  check_shape(op, "weight", weight, {C, -1});
  Index const W = weight.size(1);
  if (W < 1 || W > 4) {
    fail(op, "weight width W (dimension 1 of weight " + shape_str(weight.shape()) + ") must be in 1..4; got " +
                 std::to_string(W));
  }
  check_cu_seqlens(op, cu_seqlens, T);
  Index const N = static_cast<Index>(cu_seqlens.size()) - 1;
  if (initial_state.defined()) check_shape(op, "initial_state", initial_state, {N, C, W - 1});
}

namespace {

// The input of example n as the conv sees it: xe(q) for q >= 0 is the example's token q; for −(W−1) <= q < 0 it is
// slot W−1+q of the example's initial state (oldest first), or zeros without one. Never another example's tokens.
struct ExampleInput {
  Tensor const& x;
  Tensor const& initial_state;
  Index n, start, W;

  Eigen::VectorXd at(Index q) const {
    if (q >= 0) return x.vec({start + q});
    if (initial_state.defined()) return initial_state.mat({n}).col(W - 1 + q);
    return Eigen::VectorXd::Zero(x.size(1));
  }
};

// Pre-activation of token p of the example: Σ_j weight[:, j] ∘ xe(p − (W−1) + j).
Eigen::VectorXd pre_activation(ExampleInput const& in, Tensor const& weight, Index p) {
  Eigen::VectorXd pre = Eigen::VectorXd::Zero(weight.size(0));
  for (Index j = 0; j < in.W; ++j) pre += weight.mat({}).col(j).cwiseProduct(in.at(p - (in.W - 1) + j));
  return pre;
}

}  // namespace

Tensor conv1d_fwd(Tensor const& x, Tensor const& weight, std::vector<std::int32_t> const& cu_seqlens, bool silu,
                  Tensor const& initial_state) {
  check_args("conv1d_fwd", x, weight, cu_seqlens, initial_state);
  Index const W = weight.size(1), N = static_cast<Index>(cu_seqlens.size()) - 1;
  Tensor y(x.shape());
  for (Index n = 0; n < N; ++n) {
    ExampleInput const in{x, initial_state, n, cu_seqlens[n], W};
    for (Index p = 0; p < cu_seqlens[n + 1] - cu_seqlens[n]; ++p) {
      Eigen::VectorXd const pre = pre_activation(in, weight, p);
      y.vec({in.start + p}) = silu ? pre.unaryExpr([](double v) { return ref::silu(v); }) : pre;
    }
  }
  return y;
}

// With g = dy ∘ act'(pre): every tap j of token p sends g ∘ weight[:, j] back to the input it read, xe(p − (W−1) + j)
// (a token of the same example, or a slot of its initial state; zero padding absorbs it), and collects g ∘ xe(...)
// into dweight[:, j].
Conv1dGrads conv1d_bwd(Tensor const& dy, Tensor const& x, Tensor const& weight,
                       std::vector<std::int32_t> const& cu_seqlens, bool silu, Tensor const& initial_state) {
  check_args("conv1d_bwd", x, weight, cu_seqlens, initial_state);
  check_shape("conv1d_bwd", "dy", dy, x.shape());
  Index const W = weight.size(1), N = static_cast<Index>(cu_seqlens.size()) - 1;
  Conv1dGrads grads{Tensor(x.shape()), Tensor(weight.shape()),
                    initial_state.defined() ? Tensor(initial_state.shape()) : Tensor()};
  for (Index n = 0; n < N; ++n) {
    ExampleInput const in{x, initial_state, n, cu_seqlens[n], W};
    for (Index p = 0; p < cu_seqlens[n + 1] - cu_seqlens[n]; ++p) {
      Eigen::VectorXd g = dy.vec({in.start + p});
      if (silu) g = g.cwiseProduct(pre_activation(in, weight, p).unaryExpr([](double v) { return silu_grad(v); }));
      for (Index j = 0; j < W; ++j) {
        Index const q = p - (W - 1) + j;
        grads.dweight.mat({}).col(j) += g.cwiseProduct(in.at(q));
        Eigen::VectorXd const dinput = g.cwiseProduct(weight.mat({}).col(j));
        if (q >= 0) {
          grads.dx.vec({in.start + q}) += dinput;
        } else if (initial_state.defined()) {
          grads.dinitial_state.mat({n}).col(W - 1 + q) += dinput;
        }
      }
    }
  }
  return grads;
}

}  // namespace fusepack::ref
