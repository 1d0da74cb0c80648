// Qwen35Config: the dense Qwen3.5 text model's hyperparameters (transformers' Qwen3.5 text config), read from and
// written to Hugging Face config.json, checked in one place (validate), and the named presets. No torch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::model {

// The token mixer of one decoder layer; config.json spells them "linear_attention" and "full_attention".
enum class LayerType { kLinearAttention, kFullAttention };
char const* layer_type_name(LayerType type);
LayerType parse_layer_type(std::string const& name);  // throws std::invalid_argument for anything else

// The most decoder layers a config may name: far above any released Qwen3.5 (24 to 64 layers). A larger count is an
// error naming the field, not an allocation of its layer list (config.json is input).
inline constexpr std::int64_t kMaxHiddenLayers = 65536;

// Field names and meanings are Hugging Face's Qwen3_5TextConfig; defaults are its class defaults (which are not the
// released checkpoints' values for every field: always read config.json or take a preset).
struct Qwen35Config {
  // Sizes of the residual stream, the MLP and the vocabulary.
  std::int64_t hidden_size = 4096;         // H: width of the residual stream, embeddings and every layer's input
  std::int64_t intermediate_size = 12288;  // width of the SwiGLU MLP (gate_proj/up_proj rows)
  std::int64_t vocab_size = 248320;        // rows of embed_tokens and lm_head

  // Layer layout. layer_types[i] is layer i's token mixer; when config.json has no layer_types it is derived from
  // full_attention_interval: layer i is full attention when (i + 1) % interval == 0 ([L, L, L, F] for interval 4).
  std::int64_t num_hidden_layers = 32;     // at most kMaxHiddenLayers
  std::vector<LayerType> layer_types;      // [num_hidden_layers]
  std::int64_t full_attention_interval = 4;  // only used to derive layer_types (with_derived_layer_types)

  // Gated full attention (self_attn): q_proj has Hq·head_dim·2 rows, per head [query | gate] (section 1.5).
  std::int64_t num_attention_heads = 16;  // Hq
  std::int64_t num_key_value_heads = 4;   // Hkv; Hq must be a multiple (GQA)
  std::int64_t head_dim = 256;            // D; attention scale D^-1/2
  bool attn_output_gate = true;           // o · sigmoid(gate); HF's Qwen3.5 attention always gates, so must be true

  // Partial NeoX RoPE on the first rotary_dim() = head_dim · partial_rotary_factor channels of every q/k head.
  double rope_theta = 1e7;
  double partial_rotary_factor = 0.25;

  // Gated DeltaNet (linear_attn).
  std::int64_t linear_num_key_heads = 16;    // Hk (q and k heads)
  std::int64_t linear_num_value_heads = 32;  // Hv (v, z, b, a heads), a multiple of Hk; value head j reads key
                                             // head j / (Hv / Hk)
  std::int64_t linear_key_head_dim = 128;    // dk; query scale dk^-1/2
  std::int64_t linear_value_head_dim = 128;  // dv; also the width of the gated RMSNorm weight
  std::int64_t linear_conv_kernel_dim = 4;   // W of the depthwise causal conv1d over the q|k|v channels (1..4)

  // Norms, embeddings and initialisation.
  double rms_norm_eps = 1e-6;         // every RMSNorm, the zero-centred ones and the gated one
  bool tie_word_embeddings = false;   // lm_head reuses embed_tokens (true for 0.8B/2B/4B); no lm_head.weight then
  double initializer_range = 0.02;    // std of the normal init of every matrix (Qwen35Model::init_parameters)
  std::int64_t max_position_embeddings = 32768;  // informative: positions are not bounded by the model

  // Fields Hugging Face carries that this model supports only at one value (validate() says so otherwise).
  std::string hidden_act = "silu";
  bool attention_bias = false;

  // Derived sizes.
  std::int64_t rotary_dim() const;    // head_dim · partial_rotary_factor (HF: int(), truncating)
  std::int64_t linear_key_dim() const;    // Kd = Hk · dk
  std::int64_t linear_value_dim() const;  // Vd = Hv · dv
  std::int64_t linear_conv_dim() const;   // 2·Kd + Vd: the conv1d channels, in_proj_qkv rows [q | k | v]
  std::int64_t num_layers_of(LayerType type) const;

  // Every rule a model needs to be built, checked at once; throws std::invalid_argument listing each broken rule
  // ("Qwen35Config is invalid: num_attention_heads (12) must be a multiple of num_key_value_heads (5); ...").
  void validate() const;

  // layer_types from full_attention_interval (HF's __post_init__ when config.json has none); std::invalid_argument
  // for more than kMaxHiddenLayers layers or an interval below 1.
  static std::vector<LayerType> derived_layer_types(std::int64_t num_hidden_layers,
                                                    std::int64_t full_attention_interval);

  // Hugging Face config.json text: the VLM form ("model_type": "qwen3_5", text fields under "text_config",
  // tie_word_embeddings at the top level) or the text form ("model_type": "qwen3_5_text"). RoPE comes from
  // "rope_parameters" (v5) or the legacy top-level "rope_theta"/"partial_rotary_factor" (partial_rotary_factor
  // defaults to 0.25 as HF's does; rope_theta has no safe default and is required); rope_type must be "default"
  // (M-RoPE's mrope_section/mrope_interleaved are accepted: for text the three position rows are equal, so it is 1-D
  // RoPE). Unknown fields are ignored; MoE fields, a wrong type or an unsupported value throw std::invalid_argument
  // naming the field ("config.json: field 'text_config.hidden_size': must be an integer; got \"1024\" (string)").
  // The sizes that differ between Qwen3.5 models are required like rope_theta (hidden_size, intermediate_size,
  // vocab_size, num_hidden_layers, num_attention_heads, num_key_value_heads, linear_num_key_heads,
  // linear_num_value_heads); the head dims every release shares default to HF's values. The text is checked before it
  // is parsed (packing/json_input.h: nesting depth, UTF-16). The result is validated. from_json_file prefixes the
  // path to every message and refuses a directory.
  static Qwen35Config from_json(std::string const& text);
  static Qwen35Config from_json_file(std::string const& path);
  // The text form ("model_type": "qwen3_5_text", rope_parameters, explicit layer_types), readable by from_json and by
  // transformers' Qwen3_5TextConfig.
  std::string to_json() const;

  bool operator==(Qwen35Config const& other) const;
  bool operator!=(Qwen35Config const& other) const { return !(*this == other); }
};

// Named presets, all in presets.cpp:
//   qwen35-tiny   CPU-test size (hidden 64, 4 layers [L, L, L, F], heads of 32 and 16, vocab 256: fast in fp64 on
//                 2 cores), the model of the Hugging Face golden (golden/hf/qwen35-tiny); composite backend only (the
//                 fused gated_delta kernel takes head dims 64/128)
//   qwen35-tiny64 qwen35-tiny with DeltaNet heads of 64: the fused backend trains it on a GPU (its golden:
//                 golden/qwen35-tiny64-padded.json)
//   bench-200m    hidden 1024, 8 layers = 2 × [3 DeltaNet + 1 attention], the kernel benchmark model
//   qwen35-0.8b   Qwen/Qwen3.5-0.8B's text config (tied embeddings)
//   qwen35-27b    Qwen/Qwen3.5-27B's text config
//   qwen35-27b-4layers  its first 4 layers with its embedding and head (4.06 B parameters): a one-GPU benchmark
// preset() throws std::invalid_argument listing the known names.
Qwen35Config preset(std::string const& name);
std::vector<std::string> preset_names();

}  // namespace fusepack::model
