// The gated delta rule (Gated DeltaNet's token mixer) over packed examples, on either backend, with autograd.
// Per example and value head j (reading key head j / (Hv/Hk)), state S [K, V] starting at the example's initial
// state (or zeros): S ← exp(g_t)·S; S ← S + k̂_t ⊗ β_t (v_t − Sᵀk̂_t); o_t = Sᵀ(q̂_t · scale), with q̂, k̂ the
// l2-normalised q, k (x / sqrt(Σx² + 1e-6)) when use_qk_l2norm. Same semantics as reference/gated_delta.h.
#pragma once

#include "kernels/gated_delta/gated_delta_schedule.h"
#include "kernels/ops/backend.h"

#include <ATen/core/Tensor.h>

namespace fusepack::ops {

struct GatedDeltaResult {
  at::Tensor o;            // [T, Hv, V] in q's dtype
  at::Tensor final_state;  // [N, Hv, K, V] fp32 (fp64 for fp64 q); defined only when output_final_state
};

// q, k: [T, Hk, K]; v: [T, Hv, V] with Hv a positive multiple of Hk; g: [T, Hv] fp32 (log-space decay); beta:
// [T, Hv] in q's dtype; cu_seqlens: int32 [N+1], 0 = cu[0] <= ... <= cu[N] = T (empty examples allowed);
// scale > 0 (K^-1/2 in the model); initial_state: optional fp32 [N, Hv, K, V]. With fp64 q (composite only) g and
// initial_state may also be fp64, and the state is fp64 throughout (so fp64 tests keep fp64 precision end to end).
// Composite: the chunked algorithm (chunks of 64, UT transform, chunk-to-chunk state loop) in ATen, per example,
// computed in fp32 (fp64 for fp64 input) like Hugging Face's torch fallback; any device; autograd by ATen.
// Fused: CUDA kernels/gated_delta, contiguous fp32/bf16/fp16, K = V one of GatedDeltaHeadDims
// (kernels/gated_delta/gated_delta_head_dims.h), cu_seqlens on q's device; gradients for q, k, v, g, beta and
// initial_state, bitwise deterministic. Anything else is refused with the reason; nothing falls back.
// `schedule` (fused only) forces how the forward places o around the state recurrence
// (kernels/gated_delta/gated_delta_schedule.h); the default lets the launcher pick by shape. Tests and the benchmark
// force each; the composite refuses anything but the default.
GatedDeltaResult gated_delta(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor const& g,
                             at::Tensor const& beta, at::Tensor const& cu_seqlens, double scale, bool use_qk_l2norm,
                             Backend backend, at::Tensor const& initial_state = {}, bool output_final_state = false,
                             GatedDeltaSchedule schedule = GatedDeltaSchedule::kByShape);

}  // namespace fusepack::ops
