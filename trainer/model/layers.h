// The Qwen3.5 blocks as functions of packed activations [T, ...] and their weights (as transformers'
// Qwen3.5 modeling code computes them): the Gated DeltaNet mixer, the gated full-attention mixer and the SwiGLU MLP.
// Every op goes through kernels/ops with the given Backend, so kFused runs fused or throws (nothing here catches or
// falls back). Shape legend: T packed tokens, H hidden_size, Hq/Hkv attention heads, D head_dim, Hk/Hv DeltaNet
// key/value heads, dk/dv their head dims, C = 2·Hk·dk + Hv·dv conv channels, I intermediate_size.
#pragma once

#include "kernels/ops/backend.h"
#include "trainer/model/config.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fusepack::model {

// What keeps the packed examples apart, shared by every layer of one forward. Weights below are in the activations'
// dtype unless said otherwise.
struct SequenceLayout {
  at::Tensor cu_seqlens;    // [N+1] int32 on the activations' device
  at::Tensor position_ids;  // [T] int64, restarting at 0 per example
  std::int64_t max_seqlen = 0;
};

struct GatedDeltaNetWeights {
  at::Tensor in_proj_qkv;  // [C, H], rows [q (Hk·dk) | k (Hk·dk) | v (Hv·dv)]
  at::Tensor in_proj_z;    // [Hv·dv, H]
  at::Tensor in_proj_b;    // [Hv, H]
  at::Tensor in_proj_a;    // [Hv, H]
  at::Tensor conv1d;       // [C, 1, W] depthwise
  at::Tensor dt_bias;      // [Hv], any floating dtype (the decay is computed in fp32, or fp64 for fp64 activations)
  at::Tensor A_log;        // [Hv], likewise
  at::Tensor norm;         // [dv] gated RMSNorm gain (plain, not 1 + w)
  at::Tensor out_proj;     // [H, Hv·dv]
};

struct AttentionWeights {
  at::Tensor q_proj;  // [Hq·2D, H], per head [query (D) | gate (D)]
  at::Tensor k_proj;  // [Hkv·D, H]
  at::Tensor v_proj;  // [Hkv·D, H]
  at::Tensor o_proj;  // [H, Hq·D]
  at::Tensor q_norm;  // [D] zero-centred
  at::Tensor k_norm;  // [D] zero-centred
};

struct MlpWeights {
  at::Tensor gate_proj;  // [I, H]
  at::Tensor up_proj;    // [I, H]
  at::Tensor down_proj;  // [H, I]
};

// x [R, C] cut along its columns into contiguous parts [R, widths[i]] (Σ widths = C). Autograd's narrow + contiguous
// would return each part's gradient as a zero-filled [R, C] tensor plus a copy and then add them (three passes over
// [R, C] per part); here the parts' gradients are concatenated into one [R, C] tensor (a missing one as zeros). Same
// values: the sum only ever added zeros.
std::vector<at::Tensor> split_columns(at::Tensor const& x, std::vector<std::int64_t> const& widths);

// y_i = x · W_iᵀ for projections that read the same input (a token mixer's input projections, the MLP's gate and up).
// The forward is one GEMM per weight; the backward accumulates dx = Σ dy_i · W_i in the GEMMs themselves (each product
// added into dx by its GEMM, beta = 1) where autograd's separate linears would add their products with one more
// elementwise pass over [R, H] each, and dW_i = dy_iᵀ · x. An output whose gradient never arrives adds nothing.
// x: [R, H]; weights: [O_i, H], x's dtype and device; returns [R, O_i] per weight.
std::vector<at::Tensor> shared_input_linear(at::Tensor const& x, std::vector<at::Tensor> const& weights);

// in_proj_qkv → causal conv1d + SiLU per example over the q|k|v channels → split → g = −exp(A_log)·softplus(a +
// dt_bias) (fp32; fp64 for fp64 activations) and β = σ(b) → gated delta rule with l2-normalised q, k and scale dk^-1/2
// → gated RMSNorm with silu(z) per head → out_proj. x_TH: [T, H]; returns [T, H].
at::Tensor gated_deltanet(at::Tensor const& x_TH, GatedDeltaNetWeights const& w, Qwen35Config const& config,
                          SequenceLayout const& seq, ops::Backend backend);

// q_proj → per head [query | gate] → zero-centred RMSNorm of q and k over D → partial NeoX RoPE at position_ids →
// causal GQA attention per example (scale D^-1/2), o · σ(gate) → o_proj. x_TH: [T, H]; returns [T, H].
at::Tensor gated_attention(at::Tensor const& x_TH, AttentionWeights const& w, Qwen35Config const& config,
                           SequenceLayout const& seq, ops::Backend backend);

// down_proj(silu(gate_proj x) · up_proj x). x_TH: [T, H]; returns [T, H].
at::Tensor mlp(at::Tensor const& x_TH, MlpWeights const& w, ops::Backend backend);

}  // namespace fusepack::model
