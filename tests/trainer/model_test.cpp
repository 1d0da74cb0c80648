// The Qwen3.5 model (trainer/model): config.json reading and validation, the presets, Hugging Face parameter names and
// shapes (Qwen3.5-27B against the checkpoint's list, Qwen3.5-0.8B's size), and on the tiny model in fp64 on the CPU
// (composite backend): packed == padded == alone per example (with planted leaks that this comparison catches),
// autograd gradients against central differences through every layer type, init, load_state and the fused refusal.
#include "kernels/ops/rmsnorm.h"
#include "trainer/model/batch.h"
#include "trainer/model/config.h"
#include "trainer/model/init.h"
#include "trainer/model/layers.h"
#include "trainer/model/model.h"
#include "trainer/model/parameters.h"
#include "trainer/model/weights.h"

#include "packing/batch.h"
#include "tests/support/env.h"
#include "tests/support/expect.h"
#include "tests/support/torch_bridge.h"
#include "verify/compare.h"
#include "verify/random.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#ifdef FUSEPACK_TEST_CUDA_SLEEP
#include <ATen/cuda/Sleep.h>
#endif
#include <torch/csrc/autograd/function.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

namespace fusepack::test {
namespace {

using model::LayerType;
using model::ModelBatch;
using model::ModelOptions;
using model::Qwen35Config;
using model::Qwen35ForCausalLM;
using packing::Example;
using Shape = std::vector<int64_t>;

// One intra-op thread: the tiny model's ops are far too small to gain from threads, and on a loaded 2-core CI machine
// the thread pool's waiting multiplied the run time several times over.
class OneIntraOpThread : public ::testing::Environment {
 public:
  void SetUp() override { at::set_num_threads(1); }
};
::testing::Environment* const kOneIntraOpThread = ::testing::AddGlobalTestEnvironment(new OneIntraOpThread);

constexpr LayerType L = LayerType::kLinearAttention;
constexpr LayerType F = LayerType::kFullAttention;

// ------------------------------------------------------------------------------------------------------------------
// Config

TEST(Qwen35Config, PresetsValidateAndFollowTheThreeLinearOneFullPattern) {
  for (std::string const& name : model::preset_names()) {
    Qwen35Config const c = model::preset(name);
    EXPECT_NO_THROW(c.validate()) << name;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      EXPECT_EQ(c.layer_types[i], (i + 1) % 4 == 0 ? F : L) << name << " layer " << i;
    }
  }
  EXPECT_EQ(model::preset("qwen35-tiny").layer_types, (std::vector<LayerType>{L, L, L, F}));
  Qwen35Config const bench = model::preset("bench-200m");
  EXPECT_EQ(bench.layer_types, (std::vector<LayerType>{L, L, L, F, L, L, L, F}));
  EXPECT_EQ(bench.hidden_size, 1024);
  EXPECT_EQ(bench.num_attention_heads, 8);
  EXPECT_EQ(bench.num_key_value_heads, 2);
  EXPECT_EQ(bench.head_dim, 256);
  EXPECT_EQ(bench.linear_num_key_heads, 8);
  EXPECT_EQ(bench.linear_num_value_heads, 16);
  EXPECT_EQ(bench.linear_key_head_dim, 128);
  EXPECT_EQ(bench.linear_conv_kernel_dim, 4);
  EXPECT_EQ(bench.intermediate_size, 3072);
  EXPECT_EQ(bench.vocab_size, 32768);
  EXPECT_EQ(bench.rotary_dim(), 64);
  EXPECT_EQ(model::preset("qwen35-27b").rotary_dim(), 64);
  // qwen35-tiny64 is qwen35-tiny but for the DeltaNet head size, which the fused gated_delta kernel runs (64).
  Qwen35Config tiny64 = model::preset("qwen35-tiny64");
  EXPECT_EQ(tiny64.linear_key_head_dim, 64);
  EXPECT_EQ(tiny64.linear_value_head_dim, 64);
  tiny64.linear_key_head_dim = tiny64.linear_value_head_dim = 16;
  EXPECT_EQ(tiny64, model::preset("qwen35-tiny"));
  FUSEPACK_EXPECT_INVALID_ARGUMENT(model::preset("qwen35-9000b"), "known: qwen35-tiny, qwen35-tiny64, bench-200m");
}

// Qwen/Qwen3.5-0.8B's config.json as published (the VLM form; vision_config shortened to the fields that matter).
constexpr char kQwen35_0_8bConfigJson[] = R"({
  "architectures": ["Qwen3_5ForConditionalGeneration"],
  "image_token_id": 248056,
  "model_type": "qwen3_5",
  "text_config": {
    "attention_bias": false,
    "attention_dropout": 0.0,
    "attn_output_gate": true,
    "dtype": "bfloat16",
    "eos_token_id": 248044,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3584,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_value_head_dim": 128,
    "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144,
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": false,
    "model_type": "qwen3_5_text",
    "num_attention_heads": 8,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "use_cache": true,
    "vocab_size": 248320,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25}
  },
  "tie_word_embeddings": true,
  "transformers_version": "4.57.0.dev0",
  "video_token_id": 248057,
  "vision_config": {"depth": 12, "hidden_size": 768, "model_type": "qwen3_5", "out_hidden_size": 1024},
  "vision_end_token_id": 248054,
  "vision_start_token_id": 248053
})";

TEST(Qwen35Config, ReadsTheVlmFormConfigJsonOfQwen35_0_8b) {
  Qwen35Config const c = Qwen35Config::from_json(kQwen35_0_8bConfigJson);
  EXPECT_EQ(c, model::preset("qwen35-0.8b")) << c.to_json();
  EXPECT_TRUE(c.tie_word_embeddings);  // from the top level of the VLM form
  EXPECT_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.linear_conv_dim(), 6144);
}

TEST(Qwen35Config, ReadsTheTextFormWithLegacyRopeFieldsAndDerivedLayerTypes) {
  // No layer_types (derived from full_attention_interval = 2), legacy top-level rope_theta, no partial_rotary_factor
  // (HF's default 0.25), head counts of Qwen3.5-9B.
  Qwen35Config const c = Qwen35Config::from_json(R"({
    "model_type": "qwen3_5_text", "hidden_size": 4096, "intermediate_size": 12288, "vocab_size": 248320,
    "num_hidden_layers": 6, "full_attention_interval": 2, "num_attention_heads": 16, "num_key_value_heads": 4,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "rope_theta": 1000000.0, "rms_norm_eps": 1e-05
  })");
  EXPECT_EQ(c.layer_types, (std::vector<LayerType>{L, F, L, F, L, F}));
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 32);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.head_dim, 256);  // HF's class default
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(Qwen35Config, RoundTripsThroughToJson) {
  for (std::string const& name : model::preset_names()) {
    Qwen35Config const c = model::preset(name);
    EXPECT_EQ(Qwen35Config::from_json(c.to_json()), c) << name << ":\n" << c.to_json();
  }
}

TEST(Qwen35Config, BadConfigsFailWithMessagesNamingTheRule) {
  Qwen35Config c = model::preset("qwen35-tiny");
  c.num_key_value_heads = 3;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(c.validate(),
                                   "num_attention_heads (4) must be a multiple of num_key_value_heads (3)");

  c = model::preset("qwen35-tiny");
  c.linear_num_key_heads = 3;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(c.validate(),
                                   "linear_num_value_heads (4) must be a multiple of linear_num_key_heads (3)");

  c = model::preset("qwen35-tiny");
  c.num_hidden_layers = 5;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(c.validate(), "layer_types has 4 entries but num_hidden_layers is 5");

  c = model::preset("qwen35-tiny");
  c.partial_rotary_factor = 0.1;  // int(32 · 0.1) = 3: odd
  FUSEPACK_EXPECT_INVALID_ARGUMENT(c.validate(), "= 3 must be even");

  c = model::preset("qwen35-tiny");
  c.linear_conv_kernel_dim = 5;
  c.attn_output_gate = false;
  c.hidden_size = 0;  // every broken rule is listed, not only the first
  try {
    c.validate();
    ADD_FAILURE() << "validate() accepted a config with three broken rules";
  } catch (std::invalid_argument const& e) {
    std::string const what = e.what();
    std::printf("[  error   ] %s\n", what.c_str());
    EXPECT_NE(what.find("linear_conv_kernel_dim must be in 1..4; got 5"), std::string::npos);
    EXPECT_NE(what.find("attn_output_gate must be true"), std::string::npos);
    EXPECT_NE(what.find("hidden_size must be positive; got 0"), std::string::npos);
  }
}

TEST(Qwen35Config, BadConfigJsonFailsNamingTheField) {
  // Every required size given; `extra` comes last and overrides (nlohmann keeps the last of two equal keys).
  auto text = [](std::string const& extra) {
    return R"({"model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 128, "vocab_size": 256,
               "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
               "linear_num_key_heads": 2, "linear_num_value_heads": 4, "rope_theta": 10000)" + extra + "}";
  };
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(text(R"(, "hidden_size": "1024")")),
                                   "field 'hidden_size': must be an integer; got \"1024\" (string)");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(text(R"(, "layer_types": ["linear_attention"])")),
                                   "layer_types has 1 entries but num_hidden_layers is 4");
  // A layer count no model has is refused before its layer list is derived (a fuzzer's 118,000,767,112 asked for a
  // list of 118 billion entries and ran out of memory).
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(text(R"(, "num_hidden_layers": 118000767112)")),
                                   "field 'num_hidden_layers': must be at most 65536");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(text(R"(, "layer_types": ["mamba", "x", "y", "z"])")),
                                   "field 'layer_types': element 0: unknown layer type 'mamba'");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(text(R"(, "num_attention_heads": 6)")),
                                   "num_attention_heads (6) must be a multiple of num_key_value_heads (4)");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(text(R"(, "num_experts": 256)")),
                                   "field 'num_experts': MoE configs");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(
      Qwen35Config::from_json(text(R"(, "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000})")),
      "field 'rope_parameters.rope_type': only 'default' RoPE");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(
      Qwen35Config::from_json(text(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 5})")),
      "field 'rope_theta': the legacy field says 10000");
  std::string no_theta = text("");
  no_theta.replace(no_theta.find(R"(, "rope_theta": 10000)"), 21, "");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(no_theta), "field 'rope_parameters.rope_theta': missing");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(R"({"model_type": "qwen3_next", "rope_theta": 1})"),
                                   "field 'model_type': 'qwen3_next' is not supported");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(R"({"model_type": "qwen3_5"})"),
                                   "field 'text_config': the VLM form");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(
      Qwen35Config::from_json(R"({"model_type": "qwen3_5", "tie_word_embeddings": true, "text_config": )" +
                              text(R"(, "tie_word_embeddings": false)") + "}"),
      "field 'tie_word_embeddings': the top level says true but text_config.tie_word_embeddings says false");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json("{\"model_type\": "), "malformed JSON");
}

TEST(Qwen35Config, MissingRequiredSizesAreErrorsNotSilentDefaults) {
  // A config.json without num_hidden_layers or hidden_size silently got HF's class defaults (32 layers, 4096 wide).
  FUSEPACK_EXPECT_INVALID_ARGUMENT(
      Qwen35Config::from_json(R"({"model_type": "qwen3_5_text", "rope_theta": 10000, "intermediate_size": 128,
                                  "vocab_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4,
                                  "linear_num_key_heads": 2, "linear_num_value_heads": 4})"),
      "field 'hidden_size': missing: a required field (model sizes differ between Qwen3.5 models, so none is "
      "assumed); also missing: num_hidden_layers");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(R"({"model_type": "qwen3_5", "text_config": {}})"),
                                   "field 'text_config.hidden_size': missing");
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json(R"({"model_type": "qwen3_5_text", "hidden_size": null})"),
                                   "field 'hidden_size': missing");
}

TEST(Qwen35Config, ConfigFileErrorsNameTheFileAndWhatWasExpected) {
  std::string const dir = ::testing::TempDir();
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json_file(dir), "'" + dir + "' is a directory");
  std::string const path = dir + "fusepack_model_test_config_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({"model_type": "qwen3_5_text", "rope_theta": 10000})";
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json_file(path),
                                   path + ": config.json: field 'hidden_size': missing");
  std::ofstream(path) << "{\"model_type\": \"qwen3_5_text\",\n  \"hidden_size\": }";
  try {
    Qwen35Config::from_json_file(path);
    ADD_FAILURE() << "malformed JSON was accepted";
  } catch (std::invalid_argument const& e) {
    std::string const what = e.what();
    EXPECT_EQ(what.find("json.exception"), std::string::npos) << what;  // nlohmann's tag stays inside
    EXPECT_NE(what.find(path + ": config.json: malformed JSON (parse error at line 2, column 18"), std::string::npos)
        << what;
    EXPECT_NE(what.find("expected one JSON object, a Hugging Face config.json"), std::string::npos) << what;
  }
  std::ofstream(path) << std::string(100000, '[') + std::string(100000, ']');  // overflowed nlohmann's recursion
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json_file(path),
                                   path + ": config.json: the text nests arrays and objects more than 64 levels");
  std::ofstream(path) << std::string("\xFE\xFF\0{", 4);
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35Config::from_json_file(path), "is UTF-16 (byte order mark FE FF)");
  std::remove(path.c_str());
}

// ------------------------------------------------------------------------------------------------------------------
// Parameter names and shapes

// Qwen3.5-27B as transformers names and shapes its parameters, one layer of each type (names without
// "model.layers.i.").
std::map<std::string, Shape> qwen35_27b_linear_layer() {
  return {
      {"linear_attn.in_proj_qkv.weight", {10240, 5120}},
      {"linear_attn.in_proj_z.weight", {6144, 5120}},
      {"linear_attn.in_proj_b.weight", {48, 5120}},
      {"linear_attn.in_proj_a.weight", {48, 5120}},
      {"linear_attn.conv1d.weight", {10240, 1, 4}},
      {"linear_attn.dt_bias", {48}},
      {"linear_attn.A_log", {48}},
      {"linear_attn.norm.weight", {128}},
      {"linear_attn.out_proj.weight", {5120, 6144}},
      {"input_layernorm.weight", {5120}},
      {"post_attention_layernorm.weight", {5120}},
      {"mlp.gate_proj.weight", {17408, 5120}},
      {"mlp.up_proj.weight", {17408, 5120}},
      {"mlp.down_proj.weight", {5120, 17408}},
  };
}
std::map<std::string, Shape> qwen35_27b_full_layer() {
  return {
      {"self_attn.q_proj.weight", {12288, 5120}},
      {"self_attn.k_proj.weight", {1024, 5120}},
      {"self_attn.v_proj.weight", {1024, 5120}},
      {"self_attn.o_proj.weight", {5120, 6144}},
      {"self_attn.q_norm.weight", {256}},
      {"self_attn.k_norm.weight", {256}},
      {"input_layernorm.weight", {5120}},
      {"post_attention_layernorm.weight", {5120}},
      {"mlp.gate_proj.weight", {17408, 5120}},
      {"mlp.up_proj.weight", {17408, 5120}},
      {"mlp.down_proj.weight", {5120, 17408}},
  };
}

TEST(Qwen35Parameters, Qwen35_27bNamesAndShapesAreTheCheckpointsOnTheMetaDevice) {
  ModelOptions options;
  options.dtype = at::kBFloat16;
  options.device = c10::Device(c10::kMeta);  // 27 B parameters, nothing allocated
  Qwen35ForCausalLM const m(model::preset("qwen35-27b"), options);

  std::map<std::string, Shape> got;
  for (auto const& [name, p] : m.named_parameters()) {
    EXPECT_TRUE(got.emplace(name, p.sizes().vec()).second) << "duplicate parameter " << name;
    EXPECT_TRUE(p.is_meta()) << name;
  }
  std::map<std::string, Shape> expected = {
      {"model.embed_tokens.weight", {248320, 5120}},
      {"model.norm.weight", {5120}},
      {"lm_head.weight", {248320, 5120}},
  };
  for (int i = 0; i < 64; ++i) {
    std::string const prefix = "model.layers." + std::to_string(i) + ".";
    for (auto const& [name, shape] : (i + 1) % 4 == 0 ? qwen35_27b_full_layer() : qwen35_27b_linear_layer()) {
      expected.emplace(prefix + name, shape);
    }
  }
  EXPECT_EQ(got.size(), 1 + 48 * 14 + 16 * 11 + 2);
  for (auto const& [name, shape] : expected) {
    auto const it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << "missing parameter " << name;
    } else {
      EXPECT_EQ(it->second, shape) << name;
    }
  }
  for (auto const& [name, shape] : got) EXPECT_EQ(expected.count(name), 1u) << "unexpected parameter " << name;
  EXPECT_EQ(m.num_parameters(), model::parameter_count(m.config()));
  EXPECT_EQ(m.num_parameters(), 26895998464);  // the "27B": text model with its untied lm_head, no vision, no MTP
}

// Qwen3.5-0.8B, text model only, tied lm_head, written out from its config.json on Hugging Face:
//   embed_tokens                  248320 · 1024                                   = 254,279,680
//   18 DeltaNet layers, each      in_proj_qkv 6144·1024 + in_proj_z 2048·1024 + in_proj_b/a 2·16·1024
//                                 + conv1d 6144·4 + dt_bias/A_log 2·16 + norm 128 + out_proj 1024·2048 = 10,543,264
//   6 attention layers, each      q_proj 4096·1024 + k/v_proj 2·512·1024 + o_proj 1024·2048 + q/k_norm 2·256
//                                                                                  =  7,340,544
//   every layer                   MLP 3·3584·1024 + 2 norms · 1024                 = 11,012,096
//   final norm                    1024
//   total                         254,279,680 + 18·10,543,264 + 6·7,340,544 + 24·11,012,096 + 1024 = 752,393,024
// The checkpoint's "0.8B" also counts the vision tower (12 blocks of width 768 and the merger, about 0.1 B) and the
// MTP layer, which a text trainer does not load.
TEST(Qwen35Parameters, Qwen35_0_8bTextModelHas752MillionParameters) {
  int64_t const H = 1024, V = 248320, I = 3584;
  int64_t const gdn = 6144 * H + 2048 * H + 2 * 16 * H + 6144 * 4 + 2 * 16 + 128 + H * 2048;
  int64_t const attn = 4096 * H + 2 * 512 * H + H * 2048 + 2 * 256;
  int64_t const per_layer = 3 * I * H + 2 * H;
  int64_t const expected = V * H + 18 * gdn + 6 * attn + 24 * per_layer + H;
  EXPECT_EQ(gdn, 10543264);
  EXPECT_EQ(attn, 7340544);
  EXPECT_EQ(expected, 752393024);
  Qwen35Config const c = model::preset("qwen35-0.8b");
  EXPECT_EQ(model::parameter_count(c), expected);
  ModelOptions options;
  options.device = c10::Device(c10::kMeta);
  Qwen35ForCausalLM const m(c, options);
  EXPECT_EQ(m.num_parameters(), expected);
  EXPECT_THROW(m.parameter("lm_head.weight"), std::invalid_argument);  // tied: no lm_head of its own

  // Untied, the same model carries a second vocab × hidden matrix.
  Qwen35Config untied = c;
  untied.tie_word_embeddings = false;
  EXPECT_EQ(model::parameter_count(untied), expected + V * H);
}

// ------------------------------------------------------------------------------------------------------------------
// The tiny model in fp64 on the CPU

// Examples with random tokens and a random unsupervised prompt prefix (HF convention: labels unshifted).
std::vector<Example> random_examples(std::mt19937_64& rng, std::vector<int> const& lengths, int vocab) {
  std::vector<Example> out;
  for (int len : lengths) {
    Example ex;
    int const prompt = uniform_int(rng, 0, len / 2);
    for (int p = 0; p < len; ++p) {
      ex.input_ids.push_back(uniform_int(rng, 0, vocab - 1));
      ex.labels.push_back(p < prompt ? packing::kIgnoreIndex : ex.input_ids.back());
    }
    out.push_back(ex);
  }
  return out;
}

ModelOptions fp64_options(uint64_t seed) {
  ModelOptions o;
  o.dtype = at::kDouble;
  o.seed = seed;
  return o;
}

// The tiny model with every parameter moved off its special init values: matrices drawn with std 0.1 (instead of
// 0.02) so each branch adds O(1) to the residual stream, and the 1-D parameters (norm gains, dt_bias, A_log) jittered
// by N(0, 0.1²), so no gradient is tested at a symmetric point where terms could cancel.
Qwen35ForCausalLM tiny_fp64_model(uint64_t seed) {
  Qwen35Config c = model::preset("qwen35-tiny");
  c.initializer_range = 0.1;
  Qwen35ForCausalLM m(c, fp64_options(seed));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
  at::NoGradGuard no_grad;
  for (auto const& [name, p] : m.named_parameters()) {
    if (p.dim() == 1) p.add_(at::empty_like(p).normal_(0.0, 0.1, gen));
  }
  return m;
}

std::vector<double> to_vector(at::Tensor const& t) {
  at::Tensor const c = t.detach().to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

std::vector<double> example_losses(Qwen35ForCausalLM const& m, ModelBatch const& batch) {
  model::ForwardOptions o;
  o.per_example_loss = true;
  at::NoGradGuard no_grad;
  return to_vector(m.forward(batch, o).example_loss_sums);
}

// The model's forward composed here from its public pieces (its weights, its layers, the composite ops), per-example
// loss sums of an fp64 model, with the token mixers of the kind `leaky` seeing the whole pack as one example (positions
// still restart per example): a planted leak, kept in the test so the production forward carries no test hook. With
// `leaky` unset it is the model's forward, which the test below checks first.
at::Tensor composed_logits(Qwen35ForCausalLM const& m, ModelBatch const& b, std::optional<LayerType> leaky) {
  at::NoGradGuard no_grad;
  Qwen35Config const& c = m.config();
  model::LocalWeights w(c, m.named_parameters(), m.mixed_precision());
  std::int64_t const T = b.num_tokens();
  model::SequenceLayout const seq{b.cu_seqlens, b.position_ids, b.max_seqlen};
  model::SequenceLayout whole = seq;
  whole.cu_seqlens = at::tensor(std::vector<std::int32_t>{0, static_cast<std::int32_t>(T)}, at::kInt);
  whole.max_seqlen = T;
  auto const composite = ops::Backend::kComposite;
  at::Tensor x = at::embedding(w.acquire(model::WeightGroup::embedding()).at("model.embed_tokens.weight"), b.tokens);
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto const lw = m.layer_weights(w.acquire(model::WeightGroup::decoder_layer(i)), i);
    model::SequenceLayout const& layout = leaky == lw.type ? whole : seq;
    at::Tensor const h = ops::rmsnorm(x, lw.input_layernorm, c.rms_norm_eps, composite);
    x = x + (lw.type == LayerType::kLinearAttention ? model::gated_deltanet(h, lw.linear_attn, c, layout, composite)
                                                    : model::gated_attention(h, lw.self_attn, c, layout, composite));
    x = x + model::mlp(ops::rmsnorm(x, lw.post_attention_layernorm, c.rms_norm_eps, composite), lw.mlp, composite);
  }
  model::GroupWeights const head = w.acquire(model::WeightGroup::head());
  return at::linear(ops::rmsnorm(x, head.at("model.norm.weight"), c.rms_norm_eps, composite),
                    head.at(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"));
}

std::vector<double> composed_example_losses(Qwen35ForCausalLM const& m, ModelBatch const& b,
                                            std::optional<LayerType> leaky) {
  at::NoGradGuard no_grad;
  at::Tensor const token_loss =
      at::cross_entropy_loss(composed_logits(m, b, leaky), b.labels, {}, at::Reduction::None, model::kIgnoreIndex);
  return to_vector(at::zeros({b.num_examples}, token_loss.options()).index_add(0, b.seq_idx, token_loss));
}

// Per-example loss sums of two layouts of the same examples. They differ only by fp64 rounding: the same per-example
// math, with matrix products over different numbers of rows (BLAS may block and sum in another order). Measured: at
// most 5e-16 relative (often bitwise equal). A leak of one example into another moves a loss sum by far more (the
// planted leaks below: 4e-3 to 2e-1 relative). 1e-10 relative (atol 1e-10 for length-1 examples, which have no target
// and a loss sum of 0) sits between the two.
constexpr Tolerance kLayoutTolerance{1e-10, 1e-10};

ErrorReport compare_losses(std::string const& name, std::vector<double> const& got, std::vector<double> const& ref) {
  EXPECT_EQ(got.size(), ref.size()) << name;
  return compare_allclose(name, got.data(), ref.data(), static_cast<int64_t>(std::min(got.size(), ref.size())),
                          kLayoutTolerance);
}

// Lengths for the layout tests: a length-1 example, one across the gated delta rule's 64-token chunk boundary, and
// short ones.
std::vector<int> layout_lengths() { return {9, 1, 70, 17, 4}; }

TEST(Qwen35Model, PackedAndPaddedBatchesGiveTheSameExampleLosses) {
  auto rng = test_rng();
  Qwen35ForCausalLM const m = tiny_fp64_model(test_seed());
  std::vector<Example> const examples = random_examples(rng, layout_lengths(), 256);
  ModelBatch const packed = model::make_model_batch(packing::make_packed_batch(examples), at::kCPU);
  ModelBatch const padded = model::make_model_batch(packing::make_padded_batch(examples), at::kCPU);
  EXPECT_EQ(packed.num_targets, padded.num_targets);
  std::vector<double> const p = example_losses(m, packed), q = example_losses(m, padded);
  FUSEPACK_EXPECT_PASS(compare_losses("packed vs padded example loss sums", p, q));

  // The total is the sum of the per-example sums, and the plain forward (reduction sum) gives the same.
  at::NoGradGuard no_grad;
  model::ForwardOutput const out = m.forward(packed);
  double total = 0;
  for (double v : p) total += v;
  EXPECT_NEAR(out.loss_sum.item<double>(), total, 1e-10 * std::abs(total));  // fp64 summation order only
  EXPECT_EQ(out.num_targets, packed.num_targets);
  EXPECT_EQ(out.loss_sum.scalar_type(), at::kDouble);
}

TEST(Qwen35Model, AnExampleAloneGivesTheSameLossAsInsideThePack) {
  auto rng = test_rng();
  Qwen35ForCausalLM const m = tiny_fp64_model(test_seed());
  std::vector<Example> const examples = random_examples(rng, layout_lengths(), 256);
  std::vector<double> const in_pack =
      example_losses(m, model::make_model_batch(packing::make_packed_batch(examples), at::kCPU));
  std::vector<double> alone;
  for (Example const& ex : examples) {
    alone.push_back(example_losses(m, model::make_model_batch(packing::make_packed_batch({ex}), at::kCPU))[0]);
  }
  FUSEPACK_EXPECT_PASS(compare_losses("in pack vs alone example loss sums", in_pack, alone));
}

// The comparison above must be able to fail: with the DeltaNet layers (or the attention layers) seeing the pack as
// one example, every example after the first reads its predecessors, and the same check reports it. The leaky
// forward is composed in this test; without a leak it gives the model's own losses.
TEST(Qwen35Model, PlantedLeaksAreCaughtByThePackedVsPaddedComparison) {
  auto rng = test_rng();
  Qwen35ForCausalLM const m = tiny_fp64_model(test_seed());
  std::vector<Example> const examples = random_examples(rng, layout_lengths(), 256);
  ModelBatch const packed = model::make_model_batch(packing::make_packed_batch(examples), at::kCPU);
  std::vector<double> const padded =
      example_losses(m, model::make_model_batch(packing::make_padded_batch(examples), at::kCPU));
  FUSEPACK_EXPECT_PASS(compare_losses("the composed forward without a leak vs the model's",
                                      composed_example_losses(m, packed, std::nullopt), example_losses(m, packed)));
  for (auto [leak, name] : {std::pair{LayerType::kLinearAttention, "DeltaNet spans the pack"},
                            std::pair{LayerType::kFullAttention, "attention spans the pack"}}) {
    std::vector<double> const leaky = composed_example_losses(m, packed, leak);
    ErrorReport const r = compare_losses(std::string("planted leak: ") + name, leaky, padded);
    std::printf("[ planted  ] %s\n", r.str().c_str());
    EXPECT_FALSE(r.passed()) << "the packed-vs-padded comparison missed the planted leak: " << name;
    EXPECT_GT(r.budget_used, 1e3) << name << ": the leak should exceed the tolerance by orders of magnitude";
    EXPECT_NEAR(leaky[0], padded[0], 1e-10 * std::abs(padded[0])) << name << ": the first example sees nothing earlier";
  }
}

// The model-level no-leak property, to the bit: an example's logits depend on no other example of its pack. Each
// example in turn is redrawn (new tokens and labels, same length, so the pack's layout stays); the logits rows of
// every other example must stay bitwise equal, and the redrawn one's must change (else the check proves nothing).
// Returns the leaks found, "example i changed when example j was redrawn", and the redraws that changed nothing.
// `logits_of`: the packed batch's [T, vocab] logits.
std::vector<std::string> leaks_between_examples(std::vector<Example> const& examples, int vocab,
                                                std::function<at::Tensor(packing::PackedBatch const&)> const& logits_of,
                                                std::mt19937_64& rng) {
  std::vector<std::string> found;
  packing::PackedBatch const packed = packing::make_packed_batch(examples);
  at::Tensor const base = logits_of(packed).to(at::kCPU);
  std::vector<std::int32_t> const& cu = packed.cu_seqlens;
  auto rows = [&](at::Tensor const& logits, std::size_t i) { return logits.narrow(0, cu[i], cu[i + 1] - cu[i]); };
  for (std::size_t j = 0; j < examples.size(); ++j) {
    std::vector<Example> redrawn = examples;
    do {
      redrawn[j] = random_examples(rng, {static_cast<int>(examples[j].input_ids.size())}, vocab)[0];
    } while (redrawn[j].input_ids == examples[j].input_ids);
    at::Tensor const logits = logits_of(packing::make_packed_batch(redrawn)).to(at::kCPU);
    for (std::size_t i = 0; i < examples.size(); ++i) {
      bool const same = at::equal(rows(logits, i), rows(base, i));
      if (i != j && !same) {
        found.push_back("example " + std::to_string(i) + " changed when example " + std::to_string(j) +
                        " was redrawn");
      }
      if (i == j && same) found.push_back("redrawing example " + std::to_string(j) + " changed nothing");
    }
  }
  return found;
}

// Lengths for the no-leak property: a length-1 example first and between others, examples ending just before, at and
// past the gated delta rule's 64-token chunk boundary, short ones.
std::vector<int> isolation_lengths() { return {1, 70, 9, 64, 1, 33, 63, 4}; }

TEST(Qwen35Model, AnExamplesLogitsDependOnNoOtherExampleToTheBit) {
  auto rng = test_rng();
  Qwen35ForCausalLM const m = tiny_fp64_model(test_seed());
  model::ForwardOptions o;
  o.return_logits = true;
  auto logits_of = [&](packing::PackedBatch const& p) {
    at::NoGradGuard no_grad;
    return m.forward(model::make_model_batch(p, at::kCPU), o).logits;
  };
  std::vector<std::string> const leaks = leaks_between_examples(random_examples(rng, isolation_lengths(), 256), 256,
                                                                logits_of, rng);
  EXPECT_TRUE(leaks.empty()) << leaks.size() << " leaks, the first: " << (leaks.empty() ? "" : leaks.front());
}

// The property must be able to fail: with the DeltaNet layers (or the attention layers) seeing the pack as one
// example, every example after the first reads its predecessors, and the property names them.
TEST(Qwen35Model, PlantedLeaksFailTheModelLevelNoLeakProperty) {
  auto rng = test_rng();
  Qwen35ForCausalLM const m = tiny_fp64_model(test_seed());
  std::vector<Example> const examples = random_examples(rng, isolation_lengths(), 256);
  for (LayerType leak : {LayerType::kLinearAttention, LayerType::kFullAttention}) {
    auto logits_of = [&](packing::PackedBatch const& p) {
      return composed_logits(m, model::make_model_batch(p, at::kCPU), leak);
    };
    std::vector<std::string> const leaks = leaks_between_examples(examples, 256, logits_of, rng);
    ASSERT_FALSE(leaks.empty()) << "the planted leak went unnoticed: " << model::layer_type_name(leak);
    std::printf("[ planted  ] %s spans the pack: %zu leaks, the first: %s\n", model::layer_type_name(leak),
                leaks.size(), leaks.front().c_str());
  }
  // The composed forward without a leak passes: the failures above are the plant's.
  auto clean = [&](packing::PackedBatch const& p) {
    return composed_logits(m, model::make_model_batch(p, at::kCPU), std::nullopt);
  };
  EXPECT_TRUE(leaks_between_examples(examples, 256, clean, rng).empty());
}

// Central differences of the fp64 loss sum for chosen elements of parameters of every kind (embedding, each
// DeltaNet and attention projection including both halves of q_proj, the conv, dt_bias, A_log, both kinds of norm, the
// MLP, the final norm, lm_head) against autograd.
TEST(Qwen35Model, GradientsMatchCentralDifferencesThroughEveryLayerType) {
  auto rng = test_rng();
  Qwen35ForCausalLM m = tiny_fp64_model(test_seed());
  std::vector<Example> const examples = random_examples(rng, {6, 11, 8}, 256);
  ModelBatch const batch = model::make_model_batch(packing::make_packed_batch(examples), at::kCPU);
  m.forward(batch).loss_sum.backward();

  Qwen35Config const& c = m.config();
  int64_t const D = c.head_dim, Kd = c.linear_key_dim(), Vd = c.linear_value_dim(), C = c.linear_conv_dim();
  int64_t const H = c.hidden_size, I = c.intermediate_size, R = c.rotary_dim();
  // (parameter, row range [first, first + rows)) to draw elements from; rows picked to land in a given part.
  struct Pick {
    std::string name;
    int64_t first_row, rows;
  };
  std::string const gdn = "model.layers.0.linear_attn.", attn = "model.layers.3.self_attn.";
  int64_t const token0 = examples[0].input_ids[0];
  std::vector<Pick> picks = {
      {"model.embed_tokens.weight", token0, 1},
      {gdn + "in_proj_qkv.weight", 0, Kd},       // q rows
      {gdn + "in_proj_qkv.weight", Kd, Kd},      // k rows
      {gdn + "in_proj_qkv.weight", 2 * Kd, Vd},  // v rows
      {gdn + "in_proj_z.weight", 0, Vd},
      {gdn + "in_proj_b.weight", 0, c.linear_num_value_heads},
      {gdn + "in_proj_a.weight", 0, c.linear_num_value_heads},
      {gdn + "conv1d.weight", 0, C},
      {gdn + "dt_bias", 0, c.linear_num_value_heads},
      {gdn + "A_log", 0, c.linear_num_value_heads},
      {gdn + "norm.weight", 0, c.linear_value_head_dim},
      {gdn + "out_proj.weight", 0, H},
      {"model.layers.1.linear_attn.in_proj_qkv.weight", 0, C},
      {attn + "q_proj.weight", 0, D},  // head 0's query rows
      {attn + "q_proj.weight", D, D},  // head 0's gate rows
      {attn + "k_proj.weight", 0, c.num_key_value_heads * D},
      {attn + "v_proj.weight", 0, c.num_key_value_heads * D},
      {attn + "o_proj.weight", 0, H},
      {attn + "q_norm.weight", 0, R},      // rotary channels
      {attn + "k_norm.weight", R, D - R},  // pass-through channels
      {"model.layers.0.input_layernorm.weight", 0, H},
      {"model.layers.3.post_attention_layernorm.weight", 0, H},
      {"model.layers.2.mlp.gate_proj.weight", 0, I},
      {"model.layers.2.mlp.up_proj.weight", 0, I},
      {"model.layers.3.mlp.down_proj.weight", 0, H},
      {"model.norm.weight", 0, H},
      {"lm_head.weight", 0, c.vocab_size},
  };
  double const h = 1e-6;
  std::vector<double> analytic, numeric;
  std::vector<std::string> where;
  auto loss = [&] {
    at::NoGradGuard no_grad;
    return m.forward(batch).loss_sum.item<double>();
  };
  for (Pick const& pick : picks) {
    at::Tensor const& p = m.parameter(pick.name);
    int64_t const row_size = p.dim() == 1 ? 1 : p.numel() / p.size(0);
    at::Tensor const grad = p.grad().reshape(-1);
    at::Tensor const flat = p.detach().view(-1);
    for (int e = 0; e < cases(1, 3); ++e) {
      int64_t const row = pick.first_row + uniform_int(rng, 0, static_cast<int>(pick.rows) - 1);
      int64_t const idx = row * row_size + uniform_int(rng, 0, static_cast<int>(row_size) - 1);
      double const x0 = flat[idx].item<double>();
      flat[idx].fill_(x0 + h);
      double const up = loss();
      flat[idx].fill_(x0 - h);
      double const down = loss();
      flat[idx].fill_(x0);
      numeric.push_back((up - down) / (2 * h));
      analytic.push_back(grad[idx].item<double>());
      where.push_back(pick.name + "[" + std::to_string(idx) + "]");
    }
  }
  // Central differences err by h^2/6 |f'''| plus the loss's rounding noise over 2h. The curvature is large where a
  // DeltaNet q or k head vector is short (its l2 normalisation is steep there): one conv1d element measured
  // err = -2e8 h^2 (-0.02 at h = 1e-5, -2e-4 at h = 1e-6, on a gradient of 245); the noise of the ~1e2 loss sum is
  // ~2e-14 absolute, /2h = 1e-8 at h = 1e-6. So h = 1e-6 with 1e-6 absolute + 1e-5 relative: over 12 seeds at the
  // full level (81 elements each) the worst element used 2.2% of it (errors ~2e-8, the noise), while a missing or wrong
  // term in a backward errs by 1e-3 relative or more (h = 1e-5 already failed on the steep conv1d elements).
  ErrorReport const r =
      compare_allclose("d loss_sum / d parameter, autograd vs central differences", analytic.data(), numeric.data(),
                       static_cast<int64_t>(analytic.size()), Tolerance{1e-6, 1e-5});
  FUSEPACK_EXPECT_PASS(r);
  if (r.worst >= 0) std::printf("[  worst   ] %s\n", where[r.worst].c_str());
  int nonzero = 0;
  for (double g : numeric) nonzero += std::abs(g) > 1e-6;
  // Every picked element moves the loss: a check of zeros against zeros would prove nothing.
  EXPECT_GE(nonzero, static_cast<int>(numeric.size()) - 2) << "too many picked gradients are ~0";
}

TEST(Qwen35Model, InitIsDeterministicFromTheSeedAndTheSameInEveryDtype) {
  Qwen35Config const c = model::preset("qwen35-tiny");
  Qwen35ForCausalLM const a(c, fp64_options(7)), b(c, fp64_options(7)), other(c, fp64_options(8));
  ModelOptions fp32 = fp64_options(7);
  fp32.dtype = at::kFloat;
  Qwen35ForCausalLM const f(c, fp32);
  bool any_differs = false;
  for (std::size_t i = 0; i < a.named_parameters().size(); ++i) {
    auto const& [name, p] = a.named_parameters()[i];
    EXPECT_TRUE(at::equal(p, b.named_parameters()[i].second)) << name;
    EXPECT_TRUE(at::equal(p.to(at::kFloat), f.named_parameters()[i].second)) << name;
    any_differs = any_differs || !at::equal(p, other.named_parameters()[i].second);
  }
  EXPECT_TRUE(any_differs);
  // HF's init rules (parameters.h): zero-centred norms 0, the gated norm and dt_bias 1, A_log = log U(0.01, 16).
  EXPECT_TRUE(at::equal(a.parameter("model.layers.0.input_layernorm.weight"), at::zeros({64}, at::kDouble)));
  EXPECT_TRUE(at::equal(a.parameter("model.layers.3.self_attn.q_norm.weight"), at::zeros({32}, at::kDouble)));
  EXPECT_TRUE(at::equal(a.parameter("model.layers.0.linear_attn.norm.weight"), at::ones({16}, at::kDouble)));
  EXPECT_TRUE(at::equal(a.parameter("model.layers.0.linear_attn.dt_bias"), at::ones({4}, at::kDouble)));
  at::Tensor const A = a.parameter("model.layers.0.linear_attn.A_log").exp();
  EXPECT_TRUE((A >= 0.01).all().item<bool>() && (A <= 16).all().item<bool>()) << A;
  at::Tensor const w = a.parameter("model.layers.2.mlp.up_proj.weight");
  EXPECT_NEAR(w.std().item<double>(), 0.02, 0.002);  // 8192 draws: the sample std is within ~1% of 0.02
}

TEST(Qwen35Model, LoadStateCopiesEveryParameterAndListsEveryProblem) {
  auto rng = test_rng();
  Qwen35Config const c = model::preset("qwen35-tiny");
  Qwen35ForCausalLM const source(c, fp64_options(1));
  Qwen35ForCausalLM target(c, fp64_options(2));
  std::map<std::string, at::Tensor> state;
  for (auto const& [name, p] : source.named_parameters()) state[name] = p.detach().clone();
  target.load_state(state);
  ModelBatch const batch =
      model::make_model_batch(packing::make_packed_batch(random_examples(rng, {5, 7}, 256)), at::kCPU);
  at::NoGradGuard no_grad;
  EXPECT_EQ(target.forward(batch).loss_sum.item<double>(), source.forward(batch).loss_sum.item<double>());

  std::map<std::string, at::Tensor> bad = state;
  bad.erase("model.norm.weight");
  bad["model.layers.0.linear_attn.A_log"] = at::zeros({5}, at::kDouble);
  bad["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"].to(at::kFloat);
  bad["model.layers.0.mtp.weight"] = at::zeros({1}, at::kDouble);
  try {
    target.load_state(bad);
    ADD_FAILURE() << "load_state accepted a state with four problems";
  } catch (std::invalid_argument const& e) {
    std::string const what = e.what();
    std::printf("[  error   ] %s\n", what.c_str());
    EXPECT_NE(what.find("missing [model.norm.weight]"), std::string::npos);
    EXPECT_NE(what.find("unexpected [model.layers.0.mtp.weight]"), std::string::npos);
    EXPECT_NE(what.find("model.layers.0.linear_attn.A_log expected [4] got [5]"), std::string::npos);
    EXPECT_NE(what.find("model.layers.0.mlp.up_proj.weight expected Double got Float"), std::string::npos);
  }
  // Nothing was copied by the failed call; a dtype conversion is allowed when asked for.
  EXPECT_EQ(target.forward(batch).loss_sum.item<double>(), source.forward(batch).loss_sum.item<double>());
  std::map<std::string, at::Tensor> fp32_state;
  for (auto const& [name, t] : state) fp32_state[name] = t.to(at::kFloat);
  target.load_state(fp32_state, /*convert_dtype=*/true);
  EXPECT_TRUE(at::equal(target.parameter("lm_head.weight"), state["lm_head.weight"].to(at::kFloat).to(at::kDouble)));
}

TEST(Qwen35Model, TiedEmbeddingsUseEmbedTokensAsTheLmHead) {
  auto rng = test_rng();
  Qwen35Config untied = model::preset("qwen35-tiny");
  Qwen35Config tied = untied;
  tied.tie_word_embeddings = true;
  Qwen35ForCausalLM u(untied, fp64_options(3));
  Qwen35ForCausalLM t(tied, fp64_options(3));
  EXPECT_EQ(u.num_parameters() - t.num_parameters(), 256 * 64);
  std::map<std::string, at::Tensor> state;
  for (auto const& [name, p] : t.named_parameters()) state[name] = p.detach().clone();
  state["lm_head.weight"] = state["model.embed_tokens.weight"];
  u.load_state(state);
  ModelBatch const batch =
      model::make_model_batch(packing::make_packed_batch(random_examples(rng, {6, 3}, 256)), at::kCPU);
  at::NoGradGuard no_grad;
  EXPECT_EQ(t.forward(batch).loss_sum.item<double>(), u.forward(batch).loss_sum.item<double>());
  std::map<std::string, at::Tensor> with_head = state;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(t.load_state(with_head), "the config ties lm_head to model.embed_tokens");
}

// The place where bf16 compute over fp32 master weights will plug in: fp64 master weights computed in fp32 give the
// fp32 model's loss, and the gradients land on the fp64 parameters.
TEST(Qwen35Model, ComputeDtypeCastsTheWeightsAndGradientsReachTheMasterWeights) {
  auto rng = test_rng();
  Qwen35Config const c = model::preset("qwen35-tiny");
  ModelOptions mixed = fp64_options(4), fp32 = fp64_options(4);
  mixed.compute_dtype = at::kFloat;
  fp32.dtype = at::kFloat;
  Qwen35ForCausalLM m(c, mixed);
  Qwen35ForCausalLM const f(c, fp32);
  ModelBatch const batch =
      model::make_model_batch(packing::make_packed_batch(random_examples(rng, {8, 5}, 256)), at::kCPU);
  model::ForwardOutput const out = m.forward(batch);
  EXPECT_EQ(out.loss_sum.scalar_type(), at::kFloat);
  {
    at::NoGradGuard no_grad;
    // The same fp32 weights (init rounds the same fp64 draws) and the same fp32 ops: bitwise equal.
    EXPECT_EQ(out.loss_sum.item<double>(), f.forward(batch).loss_sum.item<double>());
  }
  out.loss_sum.backward();
  for (auto const& [name, p] : m.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().scalar_type(), at::kDouble) << name;
  }
}

// bf16 compute over fp32 masters on `device`, every op on `backend`.
ModelOptions bf16_over_fp32(at::Device device, ops::Backend backend = ops::Backend::kComposite) {
  ModelOptions o;
  o.dtype = at::kFloat;
  o.compute_dtype = at::kBFloat16;
  o.device = device;
  o.backend = backend;
  return o;
}

// A weight group's casts are one multi-tensor copy with one backward for the group: each weight must be its own
// master's cast to the bit, and each master must receive the gradient of its own cast, however the group's tensors are
// ordered. Each cast weight gets its own random upstream gradient, so a backward that hands a gradient to another
// master of the same shape (planted: the gradients reversed) or leaves it in the compute dtype fails; values are
// compared bitwise, since a cast of each tensor by itself is the definition.
void expect_group_casts_are_per_tensor_casts(at::Device device) {
  Qwen35Config const c = model::preset("qwen35-tiny");
  Qwen35ForCausalLM const m(c, bf16_over_fp32(device));
  model::LocalWeights w(c, m.named_parameters(), m.mixed_precision());
  for (model::WeightGroup const& group : {model::WeightGroup::decoder_layer(0), model::WeightGroup::head()}) {
    model::GroupWeights const got = w.acquire(group);
    ASSERT_EQ(got.size(), model::group_parameter_names(c, group).size()) << group.str();
    at::Tensor loss = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
    std::map<std::string, at::Tensor> upstream;
    for (auto const& [name, t] : got) {
      at::Tensor const& master = m.parameter(name);
      at::ScalarType const want = model::MixedPrecisionPolicy::keeps_master_dtype(name) ? at::kFloat : at::kBFloat16;
      ASSERT_EQ(t.scalar_type(), want) << name;
      EXPECT_TRUE(at::equal(t.detach(), master.detach().to(want))) << name << " is not its master's cast";
      upstream[name] = at::randn(t.sizes(), t.options().dtype(at::kFloat));
      loss = loss + (t.to(at::kFloat) * upstream[name]).sum();
    }
    for (at::Tensor const& p : m.parameters()) p.mutable_grad() = at::Tensor();
    loss.backward();
    for (auto const& [name, up] : upstream) {
      at::Tensor const& g = m.parameter(name).grad();
      ASSERT_TRUE(g.defined()) << name;
      ASSERT_EQ(g.scalar_type(), at::kFloat) << name;
      // The gradient of t.to(fp32) is the upstream rounded to t's dtype; the cast back to the master is exact.
      EXPECT_TRUE(at::equal(g, up.to(got.at(name).scalar_type()).to(at::kFloat))) << name << " got another gradient";
    }
  }
}

TEST(LocalWeights, AGroupCastIsEachTensorsCastAndGradientsReachTheirOwnMasters) {
  expect_group_casts_are_per_tensor_casts(at::kCPU);
}

TEST(LocalWeightsCuda, AGroupCastIsEachTensorsCastAndGradientsReachTheirOwnMasters) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_group_casts_are_per_tensor_casts(at::Device(at::kCUDA, 0));
}

// The casts are kept as compute copies: asked again with the masters unchanged, the source hands out the same copy
// (no new cast); after an in-place change of a master (an ATen operation, or init_parameter_rows writing through a
// raw pointer) it hands out that master's new cast, to the bit, and the other copies unchanged. A tied embedding is one
// copy for both its groups. Catches, planted: validity that ignores the version (the old values served after the
// change), init_parameter_rows not bumping the version, a tied weight given a copy per group.
void expect_compute_copies_follow_their_masters(at::Device device) {
  Qwen35Config const c = model::preset("qwen35-tiny");
  Qwen35ForCausalLM const m(c, bf16_over_fp32(device));
  model::LocalWeights w(c, m.named_parameters(), m.mixed_precision());
  model::WeightGroup const layer = model::WeightGroup::decoder_layer(0);
  model::GroupWeights const first = w.acquire(layer);
  model::GroupWeights const again = w.acquire(layer);
  std::string const changed = "model.layers.0.mlp.up_proj.weight", raw = "model.layers.0.mlp.down_proj.weight";
  ASSERT_TRUE(first.count(changed) && first.count(raw));
  for (auto const& [name, t] : first) {
    if (t.scalar_type() != at::kBFloat16) continue;  // A_log and dt_bias are read in the master dtype
    EXPECT_EQ(again.at(name).data_ptr(), t.data_ptr()) << name << ": cast again with its master unchanged";
  }
  std::map<std::string, at::Tensor> before;
  for (auto const& [name, t] : first) before[name] = t.detach().clone();
  {
    at::NoGradGuard no_grad;
    m.parameter(changed).add_(0.25);
    at::Tensor raw_master = m.parameter(raw);
    for (model::ParameterSpec const& spec : model::parameter_specs(c)) {
      if (spec.name == raw) model::init_parameter_rows(spec, 0.5, /*seed=*/77, /*row_begin=*/0, raw_master);
    }
  }
  model::GroupWeights const after = w.acquire(layer);
  for (auto const& [name, t] : after) {
    at::Tensor const want = m.parameter(name).detach().to(t.scalar_type());
    EXPECT_TRUE(at::equal(t.detach(), want)) << name << " is not its master's cast after the change";
    if (name == changed || name == raw) {
      EXPECT_FALSE(at::equal(t.detach(), before.at(name))) << name << ": the change did not reach the cast";
    } else {
      EXPECT_TRUE(at::equal(t.detach(), before.at(name))) << name << " changed with another master";
    }
  }
  Qwen35Config tied = c;  // qwen35-tiny has a head of its own
  tied.tie_word_embeddings = true;
  Qwen35ForCausalLM const tied_model(tied, bf16_over_fp32(device));
  model::LocalWeights tied_weights(tied, tied_model.named_parameters(), tied_model.mixed_precision());
  std::string const embed = "model.embed_tokens.weight";
  EXPECT_EQ(tied_weights.acquire(model::WeightGroup::embedding()).at(embed).data_ptr(),
            tied_weights.acquire(model::WeightGroup::head()).at(embed).data_ptr())
      << "a tied embedding is cast twice";
  EXPECT_EQ(tied_weights.compute_copies().count(embed), 1u);
}

TEST(LocalWeights, ComputeCopiesServeWhileTheirMastersAreUnchanged) {
  expect_compute_copies_follow_their_masters(at::kCPU);
}

TEST(LocalWeightsCuda, ComputeCopiesServeWhileTheirMastersAreUnchanged) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  expect_compute_copies_follow_their_masters(at::Device(at::kCUDA, 0));
}

// The model-level no-leak property through every fused kernel in bf16 (qwen35-tiny64: its DeltaNet heads of 64 run
// fused): an example's logits depend on no other example of its pack, to the bit.
TEST(ModelCuda, AnExamplesFusedBf16LogitsDependOnNoOtherExampleToTheBit) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  at::Device const cuda(at::kCUDA, 0);
  Qwen35Config const c = model::preset("qwen35-tiny64");
  ModelOptions o = bf16_over_fp32(cuda, ops::Backend::kFused);
  o.seed = test_seed();
  Qwen35ForCausalLM const m(c, o);
  model::ForwardOptions fo;
  fo.return_logits = true;
  auto logits_of = [&](packing::PackedBatch const& p) {
    at::NoGradGuard no_grad;
    return m.forward(model::make_model_batch(p, cuda), fo).logits;
  };
  auto rng = test_rng();
  int const vocab = static_cast<int>(std::min<std::int64_t>(c.vocab_size, 256));
  std::vector<std::string> const leaks =
      leaks_between_examples(random_examples(rng, isolation_lengths(), vocab), vocab, logits_of, rng);
  EXPECT_TRUE(leaks.empty()) << leaks.size() << " leaks, the first: " << (leaks.empty() ? "" : leaks.front());
}

#ifdef FUSEPACK_TEST_CUDA_SLEEP
// A step's batch and forward are queued behind the GPU's work, never waiting for it: a copy from pageable host memory,
// or reading cu_seqlens back for their check, would make the host wait for everything queued (the previous step's
// optimizer) and leave the GPU idle while the next kernels are queued. Measured against a spin kernel of 1-2 s: making
// the batch and running the fused forward must return in well under that (a tiny model's forward queues in
// milliseconds); the control, one ordinary pageable copy after the same spin, must take it, which shows a wait would
// be seen. The losses then equal those of a batch made with the GPU idle, so the queued copies delivered the values.
TEST(ModelCuda, TheBatchAndTheForwardAreQueuedWithoutWaitingForTheGpu) {
  FUSEPACK_SKIP_WITHOUT_CUDA();
  at::Device const cuda(at::kCUDA, 0);
  Qwen35Config const c = model::preset("qwen35-tiny64");
  Qwen35ForCausalLM const m(c, bf16_over_fp32(cuda, ops::Backend::kFused));
  auto rng = test_rng();
  packing::PackedBatch const packed = packing::make_packed_batch(random_examples(rng, {70, 9, 33}, 256));
  double const idle_loss = m.forward(model::make_model_batch(packed, cuda)).loss_sum.item<double>();  // also warms up
  auto seconds_after_a_spin = [&](auto const& work) {
    at::cuda::sleep(2'000'000'000);  // 1 to 2 s at the clock rates of current GPUs (2.0 s on an H200)
    auto const start = std::chrono::steady_clock::now();
    work();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  at::Tensor loss;
  double const queued =
      seconds_after_a_spin([&] { loss = m.forward(model::make_model_batch(packed, cuda)).loss_sum; });
  double const control = seconds_after_a_spin([&] { (void)at::ones({4}).to(cuda); });
  std::printf("[  timing  ] batch + forward queued in %.4f s; a pageable copy after the same spin took %.4f s\n",
              queued, control);
  ASSERT_GT(control, 0.4) << "the spin kernel was too short to show a wait on this GPU";
  EXPECT_LT(queued, 0.5 * control) << "making the batch or the forward waited for the GPU";
  EXPECT_EQ(loss.item<double>(), idle_loss);
}
#endif

// Whether the graph behind `t` holds a node named `name` (activation checkpointing's recompute node).
bool graph_has_node(at::Tensor const& t, std::string const& name) {
  std::vector<torch::autograd::Node*> todo{t.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    if (n->name() == name) return true;
    for (auto const& e : n->next_edges()) todo.push_back(e.function.get());
  }
  return false;
}

// Recomputing a layer in the backward runs the same ops on the same bits: every gradient equals the one of the run
// that kept the activations, to the bit (fp64, the composite backend on the CPU). The recompute node must be in the
// graph, or the equality would prove nothing.
TEST(ActivationCheckpointing, GradientsAreBitwiseEqualToTheRunWithoutIt) {
  auto rng = test_rng();
  ModelBatch const batch =
      model::make_model_batch(packing::make_packed_batch(random_examples(rng, {9, 1, 70, 17}, 256)), at::kCPU);
  auto grads = [&](std::int64_t every, bool* checkpointed) {
    ModelOptions o = fp64_options(11);
    o.checkpoint_every = every;
    Qwen35ForCausalLM m(model::preset("qwen35-tiny"), o);
    model::ForwardOutput const out = m.forward(batch);
    *checkpointed = graph_has_node(out.loss_sum, "fusepack::CheckpointBackward");
    out.loss_sum.backward();
    std::vector<at::Tensor> g{out.loss_sum.detach()};
    for (auto const& [name, p] : m.named_parameters()) g.push_back(p.grad());
    return g;
  };
  bool checkpointed = false;
  std::vector<at::Tensor> const reference = grads(0, &checkpointed);
  EXPECT_FALSE(checkpointed);
  for (std::int64_t every : {1, 2, 3}) {
    std::vector<at::Tensor> const g = grads(every, &checkpointed);
    EXPECT_TRUE(checkpointed) << "every " << every << ": no layer was checkpointed";
    ASSERT_EQ(g.size(), reference.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      ASSERT_TRUE(g[i].defined()) << "every " << every << ", tensor " << i;
      EXPECT_TRUE(at::equal(g[i], reference[i])) << "every " << every << ", tensor " << i << " (0: the loss)";
    }
  }
  ModelOptions bad = fp64_options(1);
  bad.checkpoint_every = -1;
  FUSEPACK_EXPECT_INVALID_ARGUMENT(Qwen35ForCausalLM(model::preset("qwen35-tiny"), bad), "checkpoint_every must be >= 0");
}

TEST(Qwen35Model, FusedBackendOnTheCpuThrowsInsteadOfFallingBack) {
  auto rng = test_rng();
  ModelOptions o;
  o.backend = ops::Backend::kFused;
  Qwen35ForCausalLM const m(model::preset("qwen35-tiny"), o);
  ModelBatch const batch =
      model::make_model_batch(packing::make_packed_batch(random_examples(rng, {4}, 256)), at::kCPU);
  try {
    m.forward(batch);
    ADD_FAILURE() << "the fused backend ran on CPU tensors";
  } catch (c10::Error const& e) {
    std::printf("[  error   ] %s\n", e.what_without_backtrace());
  }
}

TEST(Qwen35Model, RejectsTokensOutsideTheVocabulary) {
  Qwen35ForCausalLM const m(model::preset("qwen35-tiny"), fp64_options(5));
  Example ex{{1, 2, 300}, {1, 2, 300}};
  ModelBatch const batch = model::make_model_batch(packing::make_packed_batch({ex}), at::kCPU);
  FUSEPACK_EXPECT_INVALID_ARGUMENT(m.forward(batch), "token id 300, outside the vocabulary [0, 256)");
}

}  // namespace
}  // namespace fusepack::test
