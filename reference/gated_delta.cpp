#include "reference/gated_delta.h"

#include "reference/checks.h"

#include <cmath>
#include <string>

namespace fusepack::ref {

namespace {

struct GatedDeltaDims {
  Index T, Hk, Hv, K, V, N;
};

GatedDeltaDims check_args(std::string const& op, Tensor const& q, Tensor const& k, Tensor const& v, Tensor const& g,
                          Tensor const& beta, std::vector<std::int32_t> const& cu_seqlens, double scale,
                          Tensor const& initial_state) {
  check_rank(op, "q", q, 3);
  GatedDeltaDims d{};
  d.T = q.size(0);
  d.Hk = q.size(1);
  d.K = q.size(2);
  if (d.Hk < 1) fail(op, "q must have at least one key head; got shape " + shape_str(q.shape()));
  check_shape(op, "k", k, {d.T, d.Hk, d.K});
  check_shape(op, "v", v, {d.T, -1, -1});
  d.Hv = v.size(1);
  d.V = v.size(2);
  if (d.Hv < d.Hk || d.Hv % d.Hk != 0) {
    fail(op, "the value heads Hv=" + std::to_string(d.Hv) +
                 " (v dimension 1) must be a positive multiple of the key heads Hk=" + std::to_string(d.Hk) +
                 " (q/k dimension 1)");
  }
  check_shape(op, "g", g, {d.T, d.Hv});
  check_shape(op, "beta", beta, {d.T, d.Hv});
  check_cu_seqlens(op, cu_seqlens, d.T);
  d.N = static_cast<Index>(cu_seqlens.size()) - 1;
  check_positive(op, "scale", scale);
  if (initial_state.defined()) check_shape(op, "initial_state", initial_state, {d.N, d.Hv, d.K, d.V});
  return d;
}

// Every per-token vector is copied out of its tensor into an owned (aligned) Eigen vector before any arithmetic:
// Eigen's vectorised reductions over an unaligned Map peel a data-dependent number of leading elements, so the
// summation order would depend on the token's address, and a packed example would not compute the same bits as the
// same example alone.

// q̂ or k̂ of token t, key head h: x / sqrt(Σx² + kL2NormEps) when use_qk_l2norm, else x itself.
Eigen::VectorXd key_vector(Tensor const& x, Index t, Index h, bool use_qk_l2norm) {
  Eigen::VectorXd y = x.vec({t, h});
  if (use_qk_l2norm) y /= std::sqrt(y.squaredNorm() + kL2NormEps);
  return y;
}

// The quantities of one step of the recurrence, from the state S_prev that enters it.
struct Step {
  RowMatrix decayed;    // S' = exp(g) S_prev                 [K, V]
  Eigen::VectorXd err;  // v − S'ᵀ k̂                          [V]
  Eigen::VectorXd u;    // β (v − S'ᵀ k̂)                      [V]
  RowMatrix state;      // S = S' + k̂ uᵀ                      [K, V]
};

Step step(RowMatrix const& prev, Eigen::VectorXd const& kt, Eigen::VectorXd const& vt, double gt, double bt) {
  Step s;
  s.decayed = std::exp(gt) * prev;
  s.err = vt - s.decayed.transpose() * kt;
  s.u = bt * s.err;
  s.state = s.decayed + kt * s.u.transpose();
  return s;
}

// dx of y = x / sqrt(Σx² + kL2NormEps): with r = 1/sqrt(Σx² + eps), ∂y/∂x = r (I − y yᵀ) is symmetric, so
// dx = r (dy − y (y·dy)).
Eigen::VectorXd l2norm_bwd(Eigen::VectorXd const& dy, Eigen::VectorXd const& x) {
  double const r = 1.0 / std::sqrt(x.squaredNorm() + kL2NormEps);
  Eigen::VectorXd const y = r * x;
  return r * (dy - y * y.dot(dy));
}

RowMatrix start_state(Tensor const& initial_state, Index n, Index j, Index K, Index V) {
  if (!initial_state.defined()) return RowMatrix::Zero(K, V);
  return initial_state.mat({n, j});
}

}  // namespace

GatedDeltaOut gated_delta_fwd(Tensor const& q, Tensor const& k, Tensor const& v, Tensor const& g, Tensor const& beta,
                              std::vector<std::int32_t> const& cu_seqlens, double scale, bool use_qk_l2norm,
                              Tensor const& initial_state, bool output_final_state) {
  GatedDeltaDims const d = check_args("gated_delta_fwd", q, k, v, g, beta, cu_seqlens, scale, initial_state);
  GatedDeltaOut out{Tensor({d.T, d.Hv, d.V}), output_final_state ? Tensor({d.N, d.Hv, d.K, d.V}) : Tensor()};
  Index const group = d.Hv / d.Hk;  // value heads per key head
  for (Index n = 0; n < d.N; ++n) {
    for (Index j = 0; j < d.Hv; ++j) {
      Index const h = j / group;
      RowMatrix state = start_state(initial_state, n, j, d.K, d.V);
      for (Index t = cu_seqlens[n]; t < cu_seqlens[n + 1]; ++t) {
        Eigen::VectorXd const kt = key_vector(k, t, h, use_qk_l2norm);
        Eigen::VectorXd const qs = scale * key_vector(q, t, h, use_qk_l2norm);
        Eigen::VectorXd const vt = v.vec({t, j});
        state = step(state, kt, vt, g({t, j}), beta({t, j})).state;
        out.o.vec({t, j}) = state.transpose() * qs;
      }
      if (output_final_state) out.final_state.mat({n, j}) = state;
    }
  }
  return out;
}

// Reverse-mode through each step, walking the example backwards with dS = ∂loss/∂S (S the state after the step):
//   o = Sᵀ qs          dS += qs doᵀ,  dqs = S do
//   S = S' + k̂ uᵀ      dk̂ += dS u,    du = dSᵀ k̂,  dS' = dS
//   u = β (v − S'ᵀk̂)   dβ = du·(v − S'ᵀk̂),  dv = β du,  dS' −= k̂ (β du)ᵀ,  dk̂ −= S' (β du)
//   S' = e^g S_prev    dg = <S', dS'> (Frobenius, since ∂S'/∂g = S'),  dS_prev = e^g dS'
// The states entering each step are stored by a forward replay (clarity over memory). dq̂, dk̂ of a key head sum over
// the value heads that read it; the l2norm backward then maps them to dq, dk.
GatedDeltaGrads gated_delta_bwd(Tensor const& dout, Tensor const& dfinal_state, Tensor const& q, Tensor const& k,
                                Tensor const& v, Tensor const& g, Tensor const& beta,
                                std::vector<std::int32_t> const& cu_seqlens, double scale, bool use_qk_l2norm,
                                Tensor const& initial_state) {
  std::string const op = "gated_delta_bwd";
  GatedDeltaDims const d = check_args(op, q, k, v, g, beta, cu_seqlens, scale, initial_state);
  check_shape(op, "dout", dout, {d.T, d.Hv, d.V});
  if (dfinal_state.defined()) check_shape(op, "dfinal_state", dfinal_state, {d.N, d.Hv, d.K, d.V});

  GatedDeltaGrads grads{Tensor(q.shape()),    Tensor(k.shape()),
                        Tensor(v.shape()),    Tensor(g.shape()),
                        Tensor(beta.shape()), initial_state.defined() ? Tensor(initial_state.shape()) : Tensor()};
  Tensor dq_hat(q.shape()), dk_hat(k.shape());  // gradients w.r.t. q̂, k̂ (before the l2norm backward)
  Index const group = d.Hv / d.Hk;
  for (Index n = 0; n < d.N; ++n) {
    Index const bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
    for (Index j = 0; j < d.Hv; ++j) {
      Index const h = j / group;
      // Forward replay: entering[t − bos] is the state before token t's decay.
      std::vector<RowMatrix> entering;
      RowMatrix state = start_state(initial_state, n, j, d.K, d.V);
      for (Index t = bos; t < eos; ++t) {
        entering.push_back(state);
        state = step(state, key_vector(k, t, h, use_qk_l2norm), v.vec({t, j}), g({t, j}), beta({t, j})).state;
      }

      RowMatrix dS = dfinal_state.defined() ? RowMatrix(dfinal_state.mat({n, j})) : RowMatrix::Zero(d.K, d.V);
      for (Index t = eos - 1; t >= bos; --t) {
        Eigen::VectorXd const kt = key_vector(k, t, h, use_qk_l2norm);
        Eigen::VectorXd const qs = scale * key_vector(q, t, h, use_qk_l2norm);
        Eigen::VectorXd const vt = v.vec({t, j});
        Eigen::VectorXd const dout_t = dout.vec({t, j});
        double const gt = g({t, j}), bt = beta({t, j});
        Step const s = step(entering[t - bos], kt, vt, gt, bt);

        // o = Sᵀ qs
        dS += qs * dout_t.transpose();
        Eigen::VectorXd const dq_t = scale * (s.state * dout_t);  // d q̂, since qs = scale · q̂
        // S = S' + k̂ uᵀ
        Eigen::VectorXd dk_t = dS * s.u;  // d k̂
        Eigen::VectorXd const du = dS.transpose() * kt;
        RowMatrix dS_decayed = dS;
        // u = β (v − S'ᵀ k̂)
        Eigen::VectorXd const derr = bt * du;  // gradient of the error v − S'ᵀ k̂
        grads.dbeta({t, j}) = du.dot(s.err);
        grads.dv.vec({t, j}) = derr;
        dS_decayed -= kt * derr.transpose();
        dk_t -= s.decayed * derr;
        // S' = e^g S_prev
        grads.dg({t, j}) = s.decayed.cwiseProduct(dS_decayed).sum();
        dS = std::exp(gt) * dS_decayed;

        dq_hat.vec({t, h}) += dq_t;
        dk_hat.vec({t, h}) += dk_t;
      }
      if (initial_state.defined()) grads.dinitial_state.mat({n, j}) = dS;
    }
  }

  for (Index t = 0; t < d.T; ++t) {
    for (Index h = 0; h < d.Hk; ++h) {
      Eigen::VectorXd const dq_t = dq_hat.vec({t, h}), dk_t = dk_hat.vec({t, h});
      grads.dq.vec({t, h}) = use_qk_l2norm ? l2norm_bwd(dq_t, q.vec({t, h})) : dq_t;
      grads.dk.vec({t, h}) = use_qk_l2norm ? l2norm_bwd(dk_t, k.vec({t, h})) : dk_t;
    }
  }
  return grads;
}

}  // namespace fusepack::ref
