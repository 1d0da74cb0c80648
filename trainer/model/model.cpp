#include "trainer/model/model.h"

#include "kernels/ops/rmsnorm.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace fusepack::model {
namespace {

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

// "[a, b, c]" of at most `limit` names, then "and N more".
std::string name_list(std::vector<std::string> const& names, std::size_t limit = 8) {
  std::string s = "[";
  for (std::size_t i = 0; i < names.size() && i < limit; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > limit) s += ", and " + std::to_string(names.size() - limit) + " more";
  return s + "]";
}

}  // namespace

Qwen35ForCausalLM::Qwen35ForCausalLM(Qwen35Config config, ModelOptions options)
    : config_(std::move(config)), options_(options) {
  config_.validate();
  for (at::ScalarType t : {options_.dtype, compute_dtype()}) {
    if (!at::isFloatingType(t)) {
      throw std::invalid_argument(std::string("Qwen35ForCausalLM: the parameter and compute dtypes must be floating "
                                              "point; got ") +
                                  c10::toString(t));
    }
  }
  at::TensorOptions const opts = at::TensorOptions().dtype(options_.dtype).device(options_.device);
  for (ParameterSpec const& spec : parameter_specs(config_)) {
    index_.emplace(spec.name, params_.size());
    params_.emplace_back(spec.name, at::empty(spec.shape, opts));
  }
  // "cuda" without an index means the current device; record the one the parameters landed on, so batches made
  // for that device (cuda:0) compare equal to it.
  if (!params_.empty()) options_.device = params_.front().second.device();
  if (!options_.device.is_meta()) init_parameters(options_.seed);
  for (auto& [name, p] : params_) p.requires_grad_(true);
}

std::vector<at::Tensor> Qwen35ForCausalLM::parameters() const {
  std::vector<at::Tensor> out;
  out.reserve(params_.size());
  for (auto const& [name, p] : params_) out.push_back(p);
  return out;
}

at::Tensor const& Qwen35ForCausalLM::parameter(std::string const& name) const {
  auto const it = index_.find(name);
  if (it == index_.end()) {
    throw std::invalid_argument("Qwen35ForCausalLM has no parameter '" + name + "'" +
                                (name == "lm_head.weight" ? " (tie_word_embeddings: lm_head is model.embed_tokens)"
                                                          : ""));
  }
  return params_[it->second].second;
}

std::int64_t Qwen35ForCausalLM::num_parameters() const {
  std::int64_t n = 0;
  for (auto const& [name, p] : params_) n += p.numel();
  return n;
}

void Qwen35ForCausalLM::init_parameters(std::uint64_t seed) {
  if (options_.device.is_meta()) {
    throw std::invalid_argument("Qwen35ForCausalLM::init_parameters: the model is on the meta device (shapes only)");
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  std::vector<ParameterSpec> const specs = parameter_specs(config_);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    at::Tensor v = at::empty(specs[i].shape, at::TensorOptions().dtype(at::kDouble));
    switch (specs[i].init) {
      case ParameterInit::kNormal: v.normal_(0.0, config_.initializer_range, gen); break;
      case ParameterInit::kZeros: v.zero_(); break;
      case ParameterInit::kOnes: v.fill_(1.0); break;
      case ParameterInit::kALog: v.uniform_(0.01, 16.0, gen).log_(); break;
    }
    params_[i].second.copy_(v);
  }
}

void Qwen35ForCausalLM::load_state(std::map<std::string, at::Tensor> const& state, bool convert_dtype) {
  std::vector<std::string> missing, unexpected, misshaped, wrong_dtype;
  for (auto const& [name, p] : params_) {
    auto const it = state.find(name);
    if (it == state.end() || !it->second.defined()) {
      missing.push_back(name);
      continue;
    }
    at::Tensor const& t = it->second;
    if (t.sizes() != p.sizes()) {
      misshaped.push_back(name + " expected " + shape_str(p.sizes()) + " got " + shape_str(t.sizes()));
    } else if (!convert_dtype && t.scalar_type() != p.scalar_type()) {
      wrong_dtype.push_back(name + " expected " + c10::toString(p.scalar_type()) + " got " +
                            c10::toString(t.scalar_type()));
    } else if (!at::isFloatingType(t.scalar_type())) {
      wrong_dtype.push_back(name + " is " + c10::toString(t.scalar_type()) + ", not floating point");
    }
  }
  for (auto const& [name, t] : state) {
    if (index_.count(name) == 0) {
      unexpected.push_back(name == "lm_head.weight" && config_.tie_word_embeddings
                               ? name + " (the config ties lm_head to model.embed_tokens)"
                               : name);
    }
  }
  std::vector<std::string> problems;
  if (!missing.empty()) problems.push_back("missing " + name_list(missing));
  if (!unexpected.empty()) problems.push_back("unexpected " + name_list(unexpected));
  if (!misshaped.empty()) problems.push_back("mis-shaped " + name_list(misshaped));
  if (!wrong_dtype.empty()) {
    problems.push_back("wrong dtype " + name_list(wrong_dtype) +
                       (convert_dtype ? "" : " (pass convert_dtype to cast)"));
  }
  if (!problems.empty()) {
    std::string msg = "load_state: ";
    for (std::size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    throw std::invalid_argument(msg);
  }
  if (options_.device.is_meta()) return;  // shapes checked; nothing to hold the values
  at::NoGradGuard no_grad;
  for (auto& [name, p] : params_) p.copy_(state.at(name));
}

Qwen35ForCausalLM::Weights Qwen35ForCausalLM::master_weights() const {
  auto get = [&](std::string const& name) { return parameter(name); };
  Weights w;
  w.embed_tokens = get("model.embed_tokens.weight");
  for (std::int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    std::string const l = "model.layers." + std::to_string(i) + ".";
    LayerWeights lw;
    lw.type = config_.layer_types[i];
    lw.input_layernorm = get(l + "input_layernorm.weight");
    lw.post_attention_layernorm = get(l + "post_attention_layernorm.weight");
    if (lw.type == LayerType::kLinearAttention) {
      std::string const m = l + "linear_attn.";
      lw.linear_attn = {get(m + "in_proj_qkv.weight"), get(m + "in_proj_z.weight"), get(m + "in_proj_b.weight"),
                        get(m + "in_proj_a.weight"),   get(m + "conv1d.weight"),    get(m + "dt_bias"),
                        get(m + "A_log"),              get(m + "norm.weight"),      get(m + "out_proj.weight")};
    } else {
      std::string const m = l + "self_attn.";
      lw.self_attn = {get(m + "q_proj.weight"), get(m + "k_proj.weight"), get(m + "v_proj.weight"),
                      get(m + "o_proj.weight"), get(m + "q_norm.weight"), get(m + "k_norm.weight")};
    }
    lw.mlp = {get(l + "mlp.gate_proj.weight"), get(l + "mlp.up_proj.weight"), get(l + "mlp.down_proj.weight")};
    w.layers.push_back(std::move(lw));
  }
  w.norm = get("model.norm.weight");
  w.lm_head = config_.tie_word_embeddings ? w.embed_tokens : get("lm_head.weight");
  return w;
}

Qwen35ForCausalLM::Weights Qwen35ForCausalLM::compute_weights() const {
  Weights w = master_weights();
  at::ScalarType const type = compute_dtype();
  if (type == options_.dtype) return w;
  auto cast = [type](at::Tensor& t) {
    if (t.defined()) t = t.to(type);
  };
  bool const tied = config_.tie_word_embeddings;
  cast(w.embed_tokens);
  for (LayerWeights& l : w.layers) {
    // A_log and dt_bias stay in the master dtype: they only enter the decay, which gated_deltanet computes in fp32
    // (fp64 for fp64 activations) anyway, so rounding them to the compute dtype first would only lose bits.
    for (at::Tensor* t : {&l.input_layernorm, &l.post_attention_layernorm, &l.linear_attn.in_proj_qkv,
                          &l.linear_attn.in_proj_z, &l.linear_attn.in_proj_b, &l.linear_attn.in_proj_a,
                          &l.linear_attn.conv1d, &l.linear_attn.norm, &l.linear_attn.out_proj, &l.self_attn.q_proj,
                          &l.self_attn.k_proj, &l.self_attn.v_proj, &l.self_attn.o_proj, &l.self_attn.q_norm,
                          &l.self_attn.k_norm, &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj}) {
      cast(*t);
    }
  }
  cast(w.norm);
  if (tied) {
    w.lm_head = w.embed_tokens;
  } else {
    cast(w.lm_head);
  }
  return w;
}

ForwardOutput Qwen35ForCausalLM::forward(ModelBatch const& batch, ForwardOptions const& options) const {
  char const* const where = "Qwen35ForCausalLM::forward";
  if (options_.device.is_meta()) {
    throw std::invalid_argument(std::string(where) + ": the model is on the meta device (shapes only)");
  }
  if (!batch.tokens.defined() || batch.tokens.dim() != 1) {
    throw std::invalid_argument(std::string(where) + ": batch.tokens must be a 1-D [T] tensor (make_model_batch)");
  }
  if (batch.tokens.device() != options_.device || batch.cu_seqlens.device() != options_.device) {
    std::ostringstream os;
    os << where << ": the batch is on " << batch.tokens.device() << " but the model is on " << options_.device;
    throw std::invalid_argument(os.str());
  }
  if (batch.max_token >= config_.vocab_size || batch.max_label >= config_.vocab_size) {
    throw std::invalid_argument(std::string(where) + ": the batch holds token id " +
                                std::to_string(std::max(batch.max_token, batch.max_label)) +
                                ", outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")");
  }
  ops::Backend const backend = options_.backend;
  double const eps = config_.rms_norm_eps;
  int64_t const T = batch.num_tokens();
  Weights const w = compute_weights();

  SequenceLayout const seq{batch.cu_seqlens, batch.position_ids, batch.max_seqlen};
  SequenceLayout whole = seq;  // the planted leaks' layout: one example spanning the pack
  if (options.planted_leak != PlantedLeak::kNone) {
    whole.cu_seqlens = at::tensor(std::vector<int32_t>{0, static_cast<int32_t>(T)},
                                  at::TensorOptions().dtype(at::kInt))
                           .to(options_.device);
    whole.max_seqlen = T;
  }
  SequenceLayout const& gdn_seq = options.planted_leak == PlantedLeak::kGatedDeltaNetSpansPack ? whole : seq;
  SequenceLayout const& attn_seq = options.planted_leak == PlantedLeak::kAttentionSpansPack ? whole : seq;

  at::Tensor x_TH = at::embedding(w.embed_tokens, batch.tokens);
  for (LayerWeights const& layer : w.layers) {
    at::Tensor const h_TH = ops::rmsnorm(x_TH, layer.input_layernorm, eps, backend);
    x_TH = x_TH + (layer.type == LayerType::kLinearAttention
                       ? gated_deltanet(h_TH, layer.linear_attn, config_, gdn_seq, backend)
                       : gated_attention(h_TH, layer.self_attn, config_, attn_seq, backend));
    x_TH = x_TH + mlp(ops::rmsnorm(x_TH, layer.post_attention_layernorm, eps, backend), layer.mlp, backend);
  }
  at::Tensor const logits_TV = at::linear(ops::rmsnorm(x_TH, w.norm, eps, backend), w.lm_head);

  // HF upcasts the logits to fp32 for the loss; fp64 models stay fp64. The whole [T, vocab] logits (and their fp32
  // copy) are materialised: ~8 GB at T = 8192 with Qwen3.5's 248k vocabulary. A chunked loss goes here when that bites.
  at::ScalarType const loss_type = logits_TV.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  ForwardOutput out;
  out.num_targets = batch.num_targets;
  if (options.per_example_loss) {
    at::Tensor const token_loss_T =
        at::cross_entropy_loss(logits_TV.to(loss_type), batch.labels, {}, at::Reduction::None, kIgnoreIndex);
    out.loss_sum = token_loss_T.sum();
    out.example_loss_sums = at::zeros({batch.num_examples}, token_loss_T.options()).index_add(0, batch.seq_idx,
                                                                                              token_loss_T);
  } else {
    out.loss_sum = at::cross_entropy_loss(logits_TV.to(loss_type), batch.labels, {}, at::Reduction::Sum, kIgnoreIndex);
  }
  if (options.return_logits) out.logits = logits_TV;
  return out;
}

}  // namespace fusepack::model
