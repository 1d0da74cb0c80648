#include "trainer/model/parameters.h"

namespace fusepack::model {

std::vector<ParameterSpec> parameter_specs(Qwen35Config const& c) {
  std::int64_t const H = c.hidden_size, I = c.intermediate_size;
  std::int64_t const Hv = c.linear_num_value_heads, Vd = c.linear_value_dim(), C = c.linear_conv_dim();
  std::int64_t const Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  std::vector<ParameterSpec> specs;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, ParameterInit init) {
    specs.push_back({std::move(name), std::move(shape), init});
  };
  using P = ParameterInit;
  add("model.embed_tokens.weight", {c.vocab_size, H}, P::kNormal);
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string const layer = "model.layers." + std::to_string(i) + ".";
    if (c.layer_types[i] == LayerType::kLinearAttention) {
      std::string const m = layer + "linear_attn.";
      add(m + "dt_bias", {Hv}, P::kOnes);
      add(m + "A_log", {Hv}, P::kALog);
      add(m + "conv1d.weight", {C, 1, c.linear_conv_kernel_dim}, P::kNormal);  // depthwise, no bias
      add(m + "in_proj_qkv.weight", {C, H}, P::kNormal);                        // rows [q (Kd) | k (Kd) | v (Vd)]
      add(m + "in_proj_z.weight", {Vd, H}, P::kNormal);
      add(m + "in_proj_b.weight", {Hv, H}, P::kNormal);
      add(m + "in_proj_a.weight", {Hv, H}, P::kNormal);
      add(m + "norm.weight", {c.linear_value_head_dim}, P::kOnes);  // gated RMSNorm, plain gain, shared by heads
      add(m + "out_proj.weight", {H, Vd}, P::kNormal);
    } else {
      std::string const m = layer + "self_attn.";
      add(m + "q_proj.weight", {Hq * D * 2, H}, P::kNormal);  // per head [query (D) | gate (D)]
      add(m + "k_proj.weight", {Hkv * D, H}, P::kNormal);
      add(m + "v_proj.weight", {Hkv * D, H}, P::kNormal);
      add(m + "o_proj.weight", {H, Hq * D}, P::kNormal);
      add(m + "q_norm.weight", {D}, P::kZeros);
      add(m + "k_norm.weight", {D}, P::kZeros);
    }
    add(layer + "mlp.gate_proj.weight", {I, H}, P::kNormal);
    add(layer + "mlp.up_proj.weight", {I, H}, P::kNormal);
    add(layer + "mlp.down_proj.weight", {H, I}, P::kNormal);
    add(layer + "input_layernorm.weight", {H}, P::kZeros);
    add(layer + "post_attention_layernorm.weight", {H}, P::kZeros);
  }
  add("model.norm.weight", {H}, P::kZeros);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, H}, P::kNormal);
  return specs;
}

std::int64_t numel(std::vector<std::int64_t> const& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::int64_t parameter_count(Qwen35Config const& config) {
  std::int64_t n = 0;
  for (ParameterSpec const& s : parameter_specs(config)) n += numel(s.shape);
  return n;
}

}  // namespace fusepack::model
