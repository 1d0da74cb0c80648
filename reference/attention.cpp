#include "reference/attention.h"

#include "reference/checks.h"
#include "reference/math.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace fusepack::ref {

namespace {

struct AttentionDims {
  Index T, Hq, Hkv, D, Dv;
};

AttentionDims check_args(std::string const& op, Tensor const& q, Tensor const& k, Tensor const& v,
                         std::vector<std::int32_t> const& cu_seqlens, double scale, Tensor const& gate) {
  check_rank(op, "q", q, 3);
  AttentionDims d{};
  d.T = q.size(0);
  d.Hq = q.size(1);
  d.D = q.size(2);
  check_shape(op, "k", k, {d.T, -1, d.D});
  d.Hkv = k.size(1);
  if (d.Hkv < 1 || d.Hq < d.Hkv || d.Hq % d.Hkv != 0) {
    fail(op, "the query heads Hq=" + std::to_string(d.Hq) +
                 " (q dimension 1) must be a positive multiple of the key/value heads Hkv=" + std::to_string(d.Hkv) +
                 " (k dimension 1), which must be >= 1");
  }
  check_shape(op, "v", v, {d.T, d.Hkv, -1});
  d.Dv = v.size(2);
  if (gate.defined()) check_shape(op, "gate", gate, {d.T, d.Hq, d.Dv});
  check_cu_seqlens(op, cu_seqlens, d.T);
  check_positive(op, "scale", scale);
  return d;
}

// Every per-token vector is copied out of its tensor into an owned (aligned) Eigen vector before any arithmetic:
// Eigen's vectorised reductions over an unaligned Map peel a data-dependent number of leading elements, so the
// summation order would depend on the token's address, and a packed example would not compute the same bits as the
// same example alone.
std::vector<Eigen::VectorXd> token_vectors(Tensor const& x, Index bos, Index eos, Index h) {
  std::vector<Eigen::VectorXd> out;
  for (Index t = bos; t < eos; ++t) out.emplace_back(x.vec({t, h}));
  return out;
}

// Softmax weights of query qt over the keys keys[0..count): p_j = exp(s_j − max s) / Σ exp(s_i − max s) with
// s_j = scale · qt·k_j. Subtracting the max changes nothing mathematically and keeps exp from overflowing.
Eigen::VectorXd softmax_weights(Eigen::VectorXd const& qt, std::vector<Eigen::VectorXd> const& keys, Index count,
                                double scale) {
  Eigen::VectorXd p(count);
  for (Index j = 0; j < count; ++j) p[j] = scale * qt.dot(keys[j]);
  double const max_score = p.maxCoeff();
  double sum = 0;
  for (Index j = 0; j < count; ++j) {
    p[j] = std::exp(p[j] - max_score);
    sum += p[j];
  }
  return p / sum;
}

// o = Σ_j p_j v_j over the visible values.
Eigen::VectorXd weighted_values(Eigen::VectorXd const& p, std::vector<Eigen::VectorXd> const& values, Index Dv) {
  Eigen::VectorXd o = Eigen::VectorXd::Zero(Dv);
  for (Index j = 0; j < p.size(); ++j) o += p[j] * values[j];
  return o;
}

}  // namespace

Tensor attention_fwd(Tensor const& q, Tensor const& k, Tensor const& v, std::vector<std::int32_t> const& cu_seqlens,
                     double scale, Tensor const& gate) {
  AttentionDims const d = check_args("attention_fwd", q, k, v, cu_seqlens, scale, gate);
  Index const group = d.Hq / d.Hkv;
  Tensor out({d.T, d.Hq, d.Dv});
  for (size_t n = 0; n + 1 < cu_seqlens.size(); ++n) {
    Index const bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
    for (Index h = 0; h < d.Hq; ++h) {
      std::vector<Eigen::VectorXd> const keys = token_vectors(k, bos, eos, h / group);
      std::vector<Eigen::VectorXd> const values = token_vectors(v, bos, eos, h / group);
      for (Index t = bos; t < eos; ++t) {
        Eigen::VectorXd const qt = q.vec({t, h});
        Eigen::VectorXd const p = softmax_weights(qt, keys, t - bos + 1, scale);  // causal: keys bos..t
        Eigen::VectorXd o = weighted_values(p, values, d.Dv);
        if (gate.defined()) {
          Eigen::VectorXd const gt = gate.vec({t, h});
          for (Index i = 0; i < d.Dv; ++i) o[i] *= sigmoid(gt[i]);
        }
        out.vec({t, h}) = o;
      }
    }
  }
  return out;
}

// Per query token with P = softmax(S), S_j = scale q·k_j, o = Σ P_j v_j and the ungated output gradient w:
//   dv_j += P_j w;  dP_j = w·v_j;  dS_j = P_j (dP_j − Σ_i P_i dP_i)  (softmax Jacobian diag(P) − P Pᵀ);
//   dq = scale Σ_j dS_j k_j;  dk_j += scale dS_j q.
// With a gate, out = o ⊙ σ(gate): w = dout ⊙ σ(gate) and dgate = dout ⊙ o ⊙ σ(1 − σ).
// A key/value head is read by the `group` query heads h with h / group == its index: its dk, dv sum over them.
AttentionGrads attention_bwd(Tensor const& dout, Tensor const& q, Tensor const& k, Tensor const& v,
                             std::vector<std::int32_t> const& cu_seqlens, double scale, Tensor const& gate) {
  AttentionDims const d = check_args("attention_bwd", q, k, v, cu_seqlens, scale, gate);
  check_shape("attention_bwd", "dout", dout, {d.T, d.Hq, d.Dv});
  Index const group = d.Hq / d.Hkv;
  AttentionGrads grads{Tensor(q.shape()), Tensor(k.shape()), Tensor(v.shape()),
                       gate.defined() ? Tensor(gate.shape()) : Tensor()};
  for (size_t n = 0; n + 1 < cu_seqlens.size(); ++n) {
    Index const bos = cu_seqlens[n], eos = cu_seqlens[n + 1], len = eos - bos;
    for (Index hkv = 0; hkv < d.Hkv; ++hkv) {
      std::vector<Eigen::VectorXd> const keys = token_vectors(k, bos, eos, hkv);
      std::vector<Eigen::VectorXd> const values = token_vectors(v, bos, eos, hkv);
      std::vector<Eigen::VectorXd> dk(len, Eigen::VectorXd::Zero(d.D)), dv(len, Eigen::VectorXd::Zero(d.Dv));
      for (Index h = hkv * group; h < (hkv + 1) * group; ++h) {
        for (Index t = bos; t < eos; ++t) {
          Index const visible = t - bos + 1;
          Eigen::VectorXd const qt = q.vec({t, h});
          Eigen::VectorXd const p = softmax_weights(qt, keys, visible, scale);
          Eigen::VectorXd w = dout.vec({t, h});
          if (gate.defined()) {
            Eigen::VectorXd const gt = gate.vec({t, h});
            Eigen::VectorXd const o = weighted_values(p, values, d.Dv);
            Eigen::VectorXd dgate(d.Dv);
            for (Index i = 0; i < d.Dv; ++i) {
              double const s = sigmoid(gt[i]);
              dgate[i] = w[i] * o[i] * s * (1.0 - s);
              w[i] *= s;
            }
            grads.dgate.vec({t, h}) = dgate;
          }
          Eigen::VectorXd dp(visible);
          double p_dot_dp = 0;
          for (Index j = 0; j < visible; ++j) {
            dp[j] = w.dot(values[j]);
            p_dot_dp += p[j] * dp[j];
          }
          Eigen::VectorXd dq = Eigen::VectorXd::Zero(d.D);
          for (Index j = 0; j < visible; ++j) {
            double const ds = p[j] * (dp[j] - p_dot_dp);
            dq += scale * ds * keys[j];
            dk[j] += scale * ds * qt;
            dv[j] += p[j] * w;
          }
          grads.dq.vec({t, h}) = dq;
        }
      }
      for (Index j = 0; j < len; ++j) {
        grads.dk.vec({bos + j, hkv}) = dk[j];
        grads.dv.vec({bos + j, hkv}) = dv[j];
      }
    }
  }
  return grads;
}

}  // namespace fusepack::ref
