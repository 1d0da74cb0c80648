// The chunked gated delta rule that kernels/gated_delta/ computes, forward and backward, emulated in fp64 with the
// kernels' decomposition: the tensors the forward saves, the reverse chunk recurrence, the per-chunk gradients and the
// ordered GQA sum. It is the kernels' algorithm written for clarity, and tests/reference/gated_delta_chunked_test.cpp
// proves it equal to the naive recurrence of reference/gated_delta.h without a GPU. The chunk size is a parameter:
// small chunks put many chunk boundaries into short examples.
#pragma once

#include "reference/gated_delta.h"
#include "reference/tensor.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace fusepack::ref {

struct GatedDeltaChunkedInputs {
  Tensor q, k, v, g, beta, initial_state;  // initial_state may be undefined
  std::vector<std::int32_t> cu_seqlens;
  double scale = 1;
  bool use_qk_l2norm = true;
  Index Hk() const { return q.size(1); }
  Index Hv() const { return v.size(1); }
  Index K() const { return q.size(2); }
  Index V() const { return v.size(2); }
};

// What the forward saves for the backward, laid out as GatedDeltaFwdParams defines it (Ainv: [T, Hv, chunk], the
// values whose bf16 parts the fused forward saves), plus gcum, the forward's in-chunk cumsum of g, which the backward
// does not read: like the fp32 kernels (which sum in fp64 there), it sums g within the chunk itself.
struct GatedDeltaChunkedSaved {
  Tensor q_rstd, k_rstd, gcum, Ainv, h, v_new;
};

struct GatedDeltaChunkedOut {
  Tensor o, final_state;
  GatedDeltaChunkedSaved saved;
};

// The operands of the backward's per-chunk products (step (c) in the .cpp) as a kernel reads them, to study a split
// policy (kernels/gated_delta/gated_delta_mma.cuh, SplitPolicy) in fp64: each function maps an operand's exact value to
// the value the product reads, say the sum of its first bf16 parts; unset, the operand is read exactly. The products
// themselves stay exact in fp64, so the result differs from the exact backward by these roundings alone.
struct GatedDeltaChunkedOperands {
  std::function<double(double)> intermediate;  // y, h, and v_new in do v_newᵀ and y v_newᵀ (kGradParts)
  std::function<double(double)> vn_dh;         // v_new and dh_next in v_new dh_nextᵀ (kVnDhParts)
};

// The forward's state products as a kernel reads their operands, likewise: `state` maps h where w·h reads it (the
// chain's serial path), `state_out` where the output's (q̂e^G)·h reads it, `v_new` where the state update and the
// in-chunk output read v_new, and `carry` the state handed from one chunk to the next (the kernels keep it in fp32
// registers). Unset, each is exact. The saved h is the state as carried, the saved v_new as computed (before `v_new`
// reads it).
struct GatedDeltaChunkedFwdOperands {
  std::function<double(double)> state, state_out, v_new, carry;
};
// The forward, chunk by chunk (chunks of at most `chunk` tokens, never across examples).
GatedDeltaChunkedOut gated_delta_chunked_fwd(GatedDeltaChunkedInputs const& in, Index chunk,
                                             GatedDeltaChunkedFwdOperands const& operands = {});
// The same forward over up to `segments` segments of consecutive chunks per example, as a GPU would run one long
// example in parallel: each segment's affine map of the state first (h_end = M h_start + b, its K × K transition M
// being the chain run from the identity with no values), then the segments' true starts by a short scan from the
// initial state, then every segment's chunks from its start. Same results as gated_delta_chunked_fwd up to fp64
// rounding (no operand emulation). An example of fewer chunks than `segments` runs one chunk per segment.
GatedDeltaChunkedOut gated_delta_chunked_fwd_segmented(GatedDeltaChunkedInputs const& in, Index chunk,
                                                       Index segments);
// The backward from the inputs and the saved tensors only, as the kernels compute it (steps in the .cpp).
GatedDeltaGrads gated_delta_chunked_bwd(GatedDeltaChunkedInputs const& in, GatedDeltaChunkedSaved const& s,
                                        Tensor const& dout, Tensor const& dfinal_state, Index chunk,
                                        GatedDeltaChunkedOperands const& operands = {});
// The same backward with its reverse recurrence over up to `segments` segments of each example's chunks: each
// segment's map of the state gradient first (dh_start = R dh_end + r), then the segments' end gradients by a short
// scan from dfinal_state, then every segment's chunks from its end. Same results up to fp64 rounding.
GatedDeltaGrads gated_delta_chunked_bwd_segmented(GatedDeltaChunkedInputs const& in, GatedDeltaChunkedSaved const& s,
                                                  Tensor const& dout, Tensor const& dfinal_state, Index chunk,
                                                  Index segments);

}  // namespace fusepack::ref
