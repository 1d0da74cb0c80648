// Every parameter of Qwen3_5ForCausalLM as Hugging Face names it (transformers' Qwen3.5 modeling code, with the
// text model under "model." rather than the VLM checkpoint's "model.language_model."), its shape and its init rule,
// computed from a config without allocating anything. No torch here.
#pragma once

#include "trainer/model/config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::model {

// How Qwen35ForCausalLM::init_parameters fills a parameter (Hugging Face's _init_weights for Qwen3.5):
enum class ParameterInit {
  kNormal,  // matrices (Linear, Embedding) and the depthwise conv1d weight: normal(0, initializer_range)
  kZeros,   // zero-centred RMSNorm weights (effective gain 1 + w = 1)
  kOnes,    // the gated RMSNorm's plain weight; dt_bias
  kALog,    // A_log = log(U(0.01, 16)): HF draws U(0, 16); the lower bound keeps log finite (as HF's Kimi-Linear does)
};

struct ParameterSpec {
  std::string name;                 // e.g. "model.layers.0.linear_attn.in_proj_qkv.weight"
  std::vector<std::int64_t> shape;  // e.g. [conv_dim, hidden_size]
  ParameterInit init;
};

// In Hugging Face's named_parameters() order: embed_tokens, then per layer its mixer (linear_attn: dt_bias, A_log,
// conv1d, in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, norm, out_proj; self_attn: q_proj, k_proj, v_proj, o_proj,
// q_norm, k_norm), mlp (gate_proj, up_proj, down_proj), input_layernorm, post_attention_layernorm; then model.norm and
// lm_head (absent when tie_word_embeddings). The config must be valid.
std::vector<ParameterSpec> parameter_specs(Qwen35Config const& config);
std::int64_t numel(std::vector<std::int64_t> const& shape);
std::int64_t parameter_count(Qwen35Config const& config);  // Σ numel over parameter_specs (tied lm_head not counted)

}  // namespace fusepack::model
