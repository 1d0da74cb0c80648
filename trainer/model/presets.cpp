// The named model presets (config.h: preset, preset_names): the tiny test models, a benchmark model, and released
// Qwen3.5 shapes. Each is validated when it is made.
#include "trainer/model/config.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace fusepack::model {

namespace {

// Fields every released Qwen3.5 dense checkpoint shares (the config.json files of Qwen/Qwen3.5-* on Hugging Face).
Qwen35Config qwen35_common() {
  Qwen35Config c;
  c.head_dim = 256;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.linear_conv_kernel_dim = 4;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e7;
  c.partial_rotary_factor = 0.25;
  c.max_position_embeddings = 262144;
  return c;
}

Qwen35Config with_layers(Qwen35Config c, std::int64_t layers) {
  c.num_hidden_layers = layers;
  c.full_attention_interval = 4;
  c.layer_types = Qwen35Config::derived_layer_types(layers, 4);
  return c;
}

// The same model as golden/hf/qwen35-tiny/config.json (the Hugging Face golden).
Qwen35Config make_tiny() {
  Qwen35Config c;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.vocab_size = 256;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;  // rotary_dim 8; a multiple of 8, as FlashAttention-2 needs
  // 1e4 instead of Qwen3.5's 1e7: with only 4 frequencies, 1e7 would leave all but the first nearly still over the
  // few dozen positions of a test, and RoPE's position dependence would barely show.
  c.rope_theta = 1e4;
  c.partial_rotary_factor = 0.25;
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;  // r = 2: value head j reads key head j / 2
  // 16, not a fused gated_delta head size (64/128/256): this model is for the composite backend on the CPU.
  c.linear_key_head_dim = 16;
  c.linear_value_head_dim = 16;
  c.linear_conv_kernel_dim = 4;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;  // an lm_head of its own, so tests cover it; tying is tested on a variant
  c.max_position_embeddings = 128;
  return with_layers(c, 4);
}

// qwen35-tiny with DeltaNet heads of 64 (the smallest head size the fused gated_delta kernel runs), so the fused
// backend can train it on a GPU; its own padded golden is golden/qwen35-tiny64-padded.json.
Qwen35Config make_tiny64() {
  Qwen35Config c = make_tiny();
  c.linear_key_head_dim = 64;
  c.linear_value_head_dim = 64;
  return c;
}

Qwen35Config make_bench_200m() {
  Qwen35Config c = qwen35_common();
  c.hidden_size = 1024;
  c.intermediate_size = 3072;
  c.vocab_size = 32768;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.linear_num_key_heads = 8;
  c.linear_num_value_heads = 16;
  c.tie_word_embeddings = false;
  return with_layers(c, 8);
}

// Qwen/Qwen3.5-0.8B's config.json on Hugging Face (its text_config).
Qwen35Config make_qwen35_0_8b() {
  Qwen35Config c = qwen35_common();
  c.hidden_size = 1024;
  c.intermediate_size = 3584;
  c.vocab_size = 248320;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 16;
  c.tie_word_embeddings = true;
  return with_layers(c, 24);
}

// Qwen/Qwen3.5-27B's config.json on Hugging Face (torchtitan's flavors.py _27b and THUDM/slime's qwen3.5-27B.sh agree).
Qwen35Config make_qwen35_27b() {
  Qwen35Config c = qwen35_common();
  c.hidden_size = 5120;
  c.intermediate_size = 17408;
  c.vocab_size = 248320;
  c.num_attention_heads = 24;
  c.num_key_value_heads = 4;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 48;
  c.tie_word_embeddings = false;
  return with_layers(c, 64);
}

// The first 4 layers of Qwen3.5-27B ([L, L, L, F], 4.06 B parameters with its embedding and head): the shape of the
// big model's layers and vocabulary at a size one GPU trains, for benchmarks.
Qwen35Config make_qwen35_27b_4layers() { return with_layers(make_qwen35_27b(), 4); }

struct Preset {
  char const* name;
  Qwen35Config (*make)();
};
constexpr Preset kPresets[] = {
    {"qwen35-tiny", make_tiny},
    {"qwen35-tiny64", make_tiny64},
    {"bench-200m", make_bench_200m},
    {"qwen35-0.8b", make_qwen35_0_8b},
    {"qwen35-27b", make_qwen35_27b},
    {"qwen35-27b-4layers", make_qwen35_27b_4layers},
};

}  // namespace

Qwen35Config preset(std::string const& name) {
  for (Preset const& p : kPresets) {
    if (name == p.name) {
      Qwen35Config c = p.make();
      c.validate();
      return c;
    }
  }
  std::string known;
  for (Preset const& p : kPresets) known += (known.empty() ? "" : ", ") + std::string(p.name);
  throw std::invalid_argument("unknown model preset '" + name + "' (known: " + known + ")");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (Preset const& p : kPresets) names.emplace_back(p.name);
  return names;
}

}  // namespace fusepack::model
