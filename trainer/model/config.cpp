// Qwen35Config's derived sizes, layer types and validation; config.json is config_json.cpp, presets presets.cpp.
#include "trainer/model/config.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace fusepack::model {

char const* layer_type_name(LayerType type) {
  switch (type) {
    case LayerType::kLinearAttention: return "linear_attention";
    case LayerType::kFullAttention: return "full_attention";
  }
  return "?";
}

LayerType parse_layer_type(std::string const& name) {
  if (name == "linear_attention") return LayerType::kLinearAttention;
  if (name == "full_attention") return LayerType::kFullAttention;
  throw std::invalid_argument("unknown layer type '" + name + "' (known: linear_attention, full_attention)");
}

std::int64_t Qwen35Config::rotary_dim() const {
  return static_cast<std::int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}
std::int64_t Qwen35Config::linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
std::int64_t Qwen35Config::linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
std::int64_t Qwen35Config::linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
std::int64_t Qwen35Config::num_layers_of(LayerType type) const {
  std::int64_t n = 0;
  for (LayerType t : layer_types) n += t == type;
  return n;
}

std::vector<LayerType> Qwen35Config::derived_layer_types(std::int64_t num_hidden_layers,
                                                         std::int64_t full_attention_interval) {
  if (full_attention_interval <= 0) {
    throw std::invalid_argument("full_attention_interval must be positive to derive layer_types; got " +
                                std::to_string(full_attention_interval));
  }
  if (num_hidden_layers > kMaxHiddenLayers) {
    throw std::invalid_argument("num_hidden_layers must be at most " + std::to_string(kMaxHiddenLayers) + "; got " +
                                std::to_string(num_hidden_layers));
  }
  std::vector<LayerType> types;
  for (std::int64_t i = 0; i < num_hidden_layers; ++i) {
    types.push_back((i + 1) % full_attention_interval == 0 ? LayerType::kFullAttention : LayerType::kLinearAttention);
  }
  return types;
}

void Qwen35Config::validate() const {
  std::vector<std::string> broken;
  auto rule = [&](bool ok, auto&&... what) {
    if (ok) return;
    std::ostringstream os;
    (os << ... << what);
    broken.push_back(os.str());
  };
  auto positive = [&](char const* name, std::int64_t v) { rule(v > 0, name, " must be positive; got ", v); };
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("vocab_size", vocab_size);
  positive("num_hidden_layers", num_hidden_layers);
  rule(num_hidden_layers <= kMaxHiddenLayers, "num_hidden_layers must be at most ", kMaxHiddenLayers, "; got ",
       num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  positive("linear_num_key_heads", linear_num_key_heads);
  positive("linear_num_value_heads", linear_num_value_heads);
  positive("linear_key_head_dim", linear_key_head_dim);
  positive("linear_value_head_dim", linear_value_head_dim);

  rule(static_cast<std::int64_t>(layer_types.size()) == num_hidden_layers, "layer_types has ", layer_types.size(),
       " entries but num_hidden_layers is ", num_hidden_layers);
  if (num_attention_heads > 0 && num_key_value_heads > 0) {
    rule(num_attention_heads % num_key_value_heads == 0, "num_attention_heads (", num_attention_heads,
         ") must be a multiple of num_key_value_heads (", num_key_value_heads, ")");
  }
  if (linear_num_value_heads > 0 && linear_num_key_heads > 0) {
    rule(linear_num_value_heads % linear_num_key_heads == 0, "linear_num_value_heads (", linear_num_value_heads,
         ") must be a multiple of linear_num_key_heads (", linear_num_key_heads, ")");
  }
  // ops::conv1d takes widths 1..4 (the causal-conv1d kernels Qwen3.5 uses have the same limit).
  rule(linear_conv_kernel_dim >= 1 && linear_conv_kernel_dim <= 4, "linear_conv_kernel_dim must be in 1..4; got ",
       linear_conv_kernel_dim);
  rule(partial_rotary_factor > 0 && partial_rotary_factor <= 1, "partial_rotary_factor must be in (0, 1]; got ",
       partial_rotary_factor);
  if (head_dim > 0 && partial_rotary_factor > 0 && partial_rotary_factor <= 1) {
    std::int64_t const r = rotary_dim();
    rule(r >= 2 && r % 2 == 0, "rotary_dim = int(head_dim · partial_rotary_factor) = int(", head_dim, " · ",
         partial_rotary_factor, ") = ", r, " must be even and at least 2 (NeoX RoPE rotates channel pairs)");
  }
  rule(rope_theta > 0 && std::isfinite(rope_theta), "rope_theta must be positive; got ", rope_theta);
  rule(rms_norm_eps > 0 && std::isfinite(rms_norm_eps), "rms_norm_eps must be positive; got ", rms_norm_eps);
  rule(initializer_range >= 0 && std::isfinite(initializer_range), "initializer_range must be >= 0; got ",
       initializer_range);
  rule(hidden_act == "silu", "hidden_act must be 'silu' (Qwen3.5's SwiGLU and conv activation); got '", hidden_act,
       "'");
  rule(!attention_bias, "attention_bias must be false (Qwen3.5's projections have no bias)");
  rule(attn_output_gate, "attn_output_gate must be true (Qwen3.5's attention always gates its output; q_proj holds "
                         "[query | gate] per head)");
  if (broken.empty()) return;
  std::string msg = "Qwen35Config is invalid: ";
  for (std::size_t i = 0; i < broken.size(); ++i) msg += (i ? "; " : "") + broken[i];
  throw std::invalid_argument(msg);
}

bool Qwen35Config::operator==(Qwen35Config const& o) const {
  return hidden_size == o.hidden_size && intermediate_size == o.intermediate_size && vocab_size == o.vocab_size &&
         num_hidden_layers == o.num_hidden_layers && layer_types == o.layer_types &&
         full_attention_interval == o.full_attention_interval && num_attention_heads == o.num_attention_heads &&
         num_key_value_heads == o.num_key_value_heads && head_dim == o.head_dim &&
         attn_output_gate == o.attn_output_gate && rope_theta == o.rope_theta &&
         partial_rotary_factor == o.partial_rotary_factor && linear_num_key_heads == o.linear_num_key_heads &&
         linear_num_value_heads == o.linear_num_value_heads && linear_key_head_dim == o.linear_key_head_dim &&
         linear_value_head_dim == o.linear_value_head_dim && linear_conv_kernel_dim == o.linear_conv_kernel_dim &&
         rms_norm_eps == o.rms_norm_eps && tie_word_embeddings == o.tie_word_embeddings &&
         initializer_range == o.initializer_range && max_position_embeddings == o.max_position_embeddings &&
         hidden_act == o.hidden_act && attention_bias == o.attention_bias;
}

}  // namespace fusepack::model
