// Qwen35Config from and to Hugging Face config.json (config.h: from_json, from_json_file, to_json): the only
// translation unit that parses JSON for the model.
#include "trainer/model/config.h"

#include "packing/json_input.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fusepack::model {

namespace {

using nlohmann::json;

std::string describe(json const& v) { return packing::describe_json(v); }

[[noreturn]] void fail(std::string const& field, std::string const& what) {
  throw std::invalid_argument("config.json: field '" + field + "': " + what);
}

// Typed reads of one JSON object's fields; `prefix` ("text_config.") names where the object sits, for messages.
class Fields {
 public:
  Fields(json const& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

  bool has(char const* name) const { return obj_.contains(name) && !obj_.at(name).is_null(); }
  json const& at(char const* name) const { return obj_.at(name); }
  std::string path(char const* name) const { return prefix_ + name; }

  void integer(char const* name, std::int64_t& out) const {
    if (!has(name)) return;
    json const& v = obj_.at(name);
    if (!v.is_number_integer()) fail(path(name), "must be an integer; got " + describe(v));
    out = v.get<std::int64_t>();
  }
  void number(char const* name, double& out) const {
    if (!has(name)) return;
    json const& v = obj_.at(name);
    if (!v.is_number()) fail(path(name), "must be a number; got " + describe(v));
    out = v.get<double>();
  }
  void boolean(char const* name, bool& out) const {
    if (!has(name)) return;
    json const& v = obj_.at(name);
    if (!v.is_boolean()) fail(path(name), "must be true or false; got " + describe(v));
    out = v.get<bool>();
  }
  void string(char const* name, std::string& out) const {
    if (!has(name)) return;
    json const& v = obj_.at(name);
    if (!v.is_string()) fail(path(name), "must be a string; got " + describe(v));
    out = v.get<std::string>();
  }

 private:
  json const& obj_;
  std::string prefix_;
};

// rope_theta / partial_rotary_factor: rope_parameters (transformers v5; rope_scaling in older configs), else the
// legacy top-level fields, which v5 maps into rope_parameters. Where both places give a value they must agree.
void read_rope(Fields const& f, Qwen35Config& c) {
  bool have_theta = false, have_factor = false;
  for (char const* holder : {"rope_parameters", "rope_scaling"}) {
    if (!f.has(holder)) continue;
    json const& rp = f.at(holder);
    if (!rp.is_object()) fail(f.path(holder), "must be an object; got " + describe(rp));
    Fields r(rp, f.path(holder) + ".");
    for (char const* key : {"rope_type", "type"}) {
      std::string type = "default";
      r.string(key, type);
      if (type != "default") {
        fail(r.path(key), "only 'default' RoPE is supported (text-only M-RoPE reduces to it); got '" + type + "'");
      }
    }
    if (r.has("rope_theta")) {
      r.number("rope_theta", c.rope_theta);
      have_theta = true;
    }
    if (r.has("partial_rotary_factor")) {
      r.number("partial_rotary_factor", c.partial_rotary_factor);
      have_factor = true;
    }
  }
  auto legacy = [&](char const* name, double& field, bool& have) {
    if (!f.has(name)) return;
    double v = 0;
    f.number(name, v);
    if (have && v != field) {
      fail(f.path(name), "the legacy field says " + json(v).dump() + " but rope_parameters says " +
                             json(field).dump() + "; keep one");
    }
    field = v;
    have = true;
  };
  legacy("rope_theta", c.rope_theta, have_theta);
  legacy("partial_rotary_factor", c.partial_rotary_factor, have_factor);
  if (!have_factor) c.partial_rotary_factor = 0.25;  // HF: kwargs.setdefault("partial_rotary_factor", 0.25)
  if (!have_theta) {
    fail(f.path("rope_parameters.rope_theta"),
         "missing: give rope_parameters.rope_theta (or the legacy rope_theta); the default differs between "
         "transformers versions, so none is assumed");
  }
}

Qwen35Config read_text_config(Fields const& f) {
  Qwen35Config c;
  // The sizes that differ between Qwen3.5 models have no safe default (HF's class defaults are no released model's);
  // the ones every release shares (head_dim 256, DeltaNet head dims 128, conv width 4) keep HF's defaults.
  std::vector<std::string> missing;
  for (char const* key : {"hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads"}) {
    if (!f.has(key)) missing.push_back(f.path(key));
  }
  if (!missing.empty()) {
    std::string also;
    for (std::size_t i = 1; i < missing.size(); ++i) also += (i > 1 ? ", " : "") + missing[i];
    fail(missing.front(), "missing: a required field (model sizes differ between Qwen3.5 models, so none is "
                          "assumed)" + (also.empty() ? std::string() : "; also missing: " + also));
  }
  for (char const* moe : {"num_experts", "num_experts_per_tok", "moe_intermediate_size"}) {
    if (f.has(moe) && !(f.at(moe).is_number() && f.at(moe).get<double>() == 0)) {
      fail(f.path(moe), "MoE configs (Qwen3.5-MoE, Qwen3-Next) are not supported: this is the dense Qwen3.5 model");
    }
  }
  f.integer("hidden_size", c.hidden_size);
  f.integer("intermediate_size", c.intermediate_size);
  f.integer("vocab_size", c.vocab_size);
  f.integer("num_hidden_layers", c.num_hidden_layers);
  f.integer("num_attention_heads", c.num_attention_heads);
  f.integer("num_key_value_heads", c.num_key_value_heads);
  f.integer("head_dim", c.head_dim);
  f.boolean("attn_output_gate", c.attn_output_gate);
  f.integer("linear_num_key_heads", c.linear_num_key_heads);
  f.integer("linear_num_value_heads", c.linear_num_value_heads);
  f.integer("linear_key_head_dim", c.linear_key_head_dim);
  f.integer("linear_value_head_dim", c.linear_value_head_dim);
  f.integer("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  f.number("rms_norm_eps", c.rms_norm_eps);
  f.boolean("tie_word_embeddings", c.tie_word_embeddings);
  f.number("initializer_range", c.initializer_range);
  f.integer("max_position_embeddings", c.max_position_embeddings);
  f.string("hidden_act", c.hidden_act);
  f.boolean("attention_bias", c.attention_bias);
  read_rope(f, c);

  f.integer("full_attention_interval", c.full_attention_interval);
  if (c.num_hidden_layers > kMaxHiddenLayers) {
    fail(f.path("num_hidden_layers"), "must be at most " + std::to_string(kMaxHiddenLayers) +
                                          " (released Qwen3.5 models have 24 to 64); got " +
                                          std::to_string(c.num_hidden_layers));
  }
  if (f.has("layer_types")) {
    json const& lt = f.at("layer_types");
    if (!lt.is_array()) fail(f.path("layer_types"), "must be an array of strings; got " + describe(lt));
    for (std::size_t i = 0; i < lt.size(); ++i) {
      if (!lt[i].is_string()) {
        fail(f.path("layer_types"), "element " + std::to_string(i) + " is " + describe(lt[i]) + ", not a string");
      }
      try {
        c.layer_types.push_back(parse_layer_type(lt[i].get<std::string>()));
      } catch (std::invalid_argument const& e) {
        fail(f.path("layer_types"), "element " + std::to_string(i) + ": " + e.what());
      }
    }
  } else {
    if (c.full_attention_interval <= 0) {
      fail(f.path("full_attention_interval"), "must be positive to derive layer_types; got " +
                                                  std::to_string(c.full_attention_interval));
    }
    c.layer_types = Qwen35Config::derived_layer_types(std::max<std::int64_t>(c.num_hidden_layers, 0),
                                                      c.full_attention_interval);
  }
  return c;
}

}  // namespace

Qwen35Config Qwen35Config::from_json(std::string const& text) {
  if (std::string const problem = packing::json_text_problem(text); !problem.empty()) {
    throw std::invalid_argument("config.json: the text " + problem);
  }
  json doc;
  try {
    doc = json::parse(text);
  } catch (json::parse_error const& e) {
    throw std::invalid_argument("config.json: malformed JSON (" + packing::json_parse_detail(e.what()) +
                                "); expected one JSON object, a Hugging Face config.json");
  } catch (json::out_of_range const& e) {  // a number beyond double's range, such as 1e400
    throw std::invalid_argument("config.json: a number is out of range (" + packing::json_parse_detail(e.what()) +
                                ")");
  }
  if (!doc.is_object()) throw std::invalid_argument("config.json: must be a JSON object; got " + describe(doc));
  Fields top(doc, "");
  std::string model_type;
  if (!top.has("model_type")) fail("model_type", "missing (expected 'qwen3_5' or 'qwen3_5_text')");
  top.string("model_type", model_type);

  Qwen35Config c;
  if (model_type == "qwen3_5") {
    if (!top.has("text_config") || !doc.at("text_config").is_object()) {
      fail("text_config", "the VLM form (model_type 'qwen3_5') needs a text_config object");
    }
    Fields inner(doc.at("text_config"), "text_config.");
    c = read_text_config(inner);
    // The VLM's tie_word_embeddings sits at the top level (Qwen3_5Config); a text_config copy must agree.
    if (top.has("tie_word_embeddings")) {
      bool tie = false;
      top.boolean("tie_word_embeddings", tie);
      if (inner.has("tie_word_embeddings") && tie != c.tie_word_embeddings) {
        fail("tie_word_embeddings", std::string("the top level says ") + (tie ? "true" : "false") +
                                        " but text_config.tie_word_embeddings says " +
                                        (c.tie_word_embeddings ? "true" : "false"));
      }
      c.tie_word_embeddings = tie;
    }
  } else if (model_type == "qwen3_5_text") {
    c = read_text_config(top);
  } else {
    fail("model_type", "'" + model_type +
                           "' is not supported: this is the dense Qwen3.5 model (model_type 'qwen3_5' with a "
                           "text_config, or 'qwen3_5_text')");
  }
  c.validate();
  return c;
}

Qwen35Config Qwen35Config::from_json_file(std::string const& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw std::invalid_argument("config file '" + path + "' is a directory; expected a config.json file");
  }
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot open config file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return from_json(text.str());
  } catch (std::invalid_argument const& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

std::string Qwen35Config::to_json() const {
  json layer_names = json::array();
  for (LayerType t : layer_types) layer_names.push_back(layer_type_name(t));
  json doc = {
      {"architectures", {"Qwen3_5ForCausalLM"}},
      {"model_type", "qwen3_5_text"},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"vocab_size", vocab_size},
      {"num_hidden_layers", num_hidden_layers},
      {"layer_types", layer_names},
      {"full_attention_interval", full_attention_interval},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"attn_output_gate", attn_output_gate},
      {"rope_parameters",
       {{"rope_type", "default"}, {"rope_theta", rope_theta}, {"partial_rotary_factor", partial_rotary_factor}}},
      {"linear_num_key_heads", linear_num_key_heads},
      {"linear_num_value_heads", linear_num_value_heads},
      {"linear_key_head_dim", linear_key_head_dim},
      {"linear_value_head_dim", linear_value_head_dim},
      {"linear_conv_kernel_dim", linear_conv_kernel_dim},
      {"rms_norm_eps", rms_norm_eps},
      {"tie_word_embeddings", tie_word_embeddings},
      {"initializer_range", initializer_range},
      {"max_position_embeddings", max_position_embeddings},
      {"hidden_act", hidden_act},
      {"attention_bias", attention_bias},
  };
  return doc.dump(2) + "\n";
}

}  // namespace fusepack::model
