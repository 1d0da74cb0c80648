#include "reference/cross_entropy.h"

#include "reference/checks.h"

#include <cmath>
#include <string>

namespace fusepack::ref {

static void check_args(std::string const& op, Tensor const& logits, std::vector<std::int64_t> const& labels,
                       std::int64_t ignore_index) {
  check_rank(op, "logits", logits, 2);
  Index const T = logits.size(0), vocab = logits.size(1);
  if (static_cast<Index>(labels.size()) != T) {
    fail(op, "labels has " + std::to_string(labels.size()) + " entries; expected T=" + std::to_string(T) +
                 " (one per row of logits " + shape_str(logits.shape()) + ")");
  }
  for (Index t = 0; t < T; ++t) {
    std::int64_t const label = labels[t];
    if (label != ignore_index && (label < 0 || label >= vocab)) {
      fail(op, "labels[" + std::to_string(t) + "]=" + std::to_string(label) + " is outside the vocabulary [0, " +
                   std::to_string(vocab) + ") and is not ignore_index=" + std::to_string(ignore_index));
    }
  }
}

// A row shifted by its max so that no exp overflows (the largest term is exp(0) = 1): logsumexp(x) − x[label] =
// log Σ e − shifted[label], softmax = e / Σ e, exact to rounding even for logits of ±1000. std::exp per element:
// Eigen's vectorised exp clamps its argument (exp(−2000) gave 5.6e-309, not 0).
struct ShiftedExp {
  Eigen::VectorXd shifted;  // x − max(x)
  Eigen::VectorXd e;        // exp(x − max(x))
  double sum = 0;           // Σ e, in [1, vocab]
};

static ShiftedExp shifted_exp(Eigen::Ref<Eigen::VectorXd const> const& row) {
  ShiftedExp r;
  r.shifted = row.array() - row.maxCoeff();
  r.e.resize(row.size());
  for (Index j = 0; j < row.size(); ++j) r.e[j] = std::exp(r.shifted[j]);
  r.sum = r.e.sum();
  return r;
}

CrossEntropyOut cross_entropy_fwd(Tensor const& logits, std::vector<std::int64_t> const& labels,
                                  std::int64_t ignore_index) {
  check_args("cross_entropy_fwd", logits, labels, ignore_index);
  CrossEntropyOut out;
  for (Index t = 0; t < logits.size(0); ++t) {
    if (labels[t] == ignore_index) continue;
    ShiftedExp const r = shifted_exp(logits.vec({t}));
    out.loss_sum += std::log(r.sum) - r.shifted[labels[t]];
    ++out.num_targets;
  }
  return out;
}

// d/dlogits[t, j] of (logsumexp(logits[t]) − logits[t, label]) = softmax_j − [j == label].
Tensor cross_entropy_bwd(double dloss_sum, Tensor const& logits, std::vector<std::int64_t> const& labels,
                         std::int64_t ignore_index) {
  check_args("cross_entropy_bwd", logits, labels, ignore_index);
  Tensor dlogits(logits.shape());
  for (Index t = 0; t < logits.size(0); ++t) {
    if (labels[t] == ignore_index) continue;
    ShiftedExp const r = shifted_exp(logits.vec({t}));
    Eigen::VectorXd p = r.e / r.sum;  // softmax
    p[labels[t]] -= 1.0;
    dlogits.vec({t}) = dloss_sum * p;
  }
  return dlogits;
}

}  // namespace fusepack::ref
