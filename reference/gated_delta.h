// The gated delta rule (Gated DeltaNet), as the naive per-token recurrence over packed examples, fp64 reference.
// Per example and value head j (reading key head j / (Hv / Hk)), with state S [K, V] starting at the example's
// initial state (or zeros) and q̂, k̂ the l2-normalised q, k when use_qk_l2norm (x / sqrt(Σx² + kL2NormEps)):
//   S ← S · exp(g_t)                           decay first
//   S ← S + k̂_t ⊗ β_t (v_t − Sᵀ k̂_t)          delta-rule update with the decayed S
//   o_t = Sᵀ (q̂_t · scale)                     output from the updated state
#pragma once

#include "reference/tensor.h"

#include <cstdint>
#include <vector>

namespace fusepack::ref {

inline constexpr double kL2NormEps = 1e-6;  // fla's l2norm and Hugging Face's torch fallback use 1e-6

struct GatedDeltaOut {
  Tensor o;            // [T, Hv, V]
  Tensor final_state;  // [N, Hv, K, V]; defined only when output_final_state
};

struct GatedDeltaGrads {
  Tensor dq;              // [T, Hk, K]
  Tensor dk;              // [T, Hk, K]
  Tensor dv;              // [T, Hv, V]
  Tensor dg;              // [T, Hv]
  Tensor dbeta;           // [T, Hv]
  Tensor dinitial_state;  // [N, Hv, K, V]; defined only when an initial_state was given
};

// q, k: [T, Hk, K]; v: [T, Hv, V] with Hv a multiple of Hk; g: [T, Hv] log-space decay (<= 0 in the model, any
// value accepted here); beta: [T, Hv]; cu_seqlens: [N+1]; scale > 0 (K^−1/2 in the model);
// initial_state: optional [N, Hv, K, V].
GatedDeltaOut gated_delta_fwd(Tensor const& q, Tensor const& k, Tensor const& v, Tensor const& g, Tensor const& beta,
                              std::vector<std::int32_t> const& cu_seqlens, double scale, bool use_qk_l2norm,
                              Tensor const& initial_state = {}, bool output_final_state = false);
// dout: [T, Hv, V]; dfinal_state: optional [N, Hv, K, V] (the gradient flowing into the returned final state).
GatedDeltaGrads gated_delta_bwd(Tensor const& dout, Tensor const& dfinal_state, Tensor const& q, Tensor const& k,
                                Tensor const& v, Tensor const& g, Tensor const& beta,
                                std::vector<std::int32_t> const& cu_seqlens, double scale, bool use_qk_l2norm,
                                Tensor const& initial_state = {});

}  // namespace fusepack::ref
