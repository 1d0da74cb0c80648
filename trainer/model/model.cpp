#include "trainer/model/model.h"

#include "kernels/ops/linear_cross_entropy.h"
#include "kernels/ops/op_scope.h"
#include "kernels/ops/rmsnorm.h"
#include "packing/text.h"
#include "trainer/model/checkpoint.h"
#include "trainer/model/init.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace fusepack::model {
namespace {

using packing::shape_str;

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
  if (options_.checkpoint_every < 0) {
    throw std::invalid_argument("Qwen35ForCausalLM: checkpoint_every must be >= 0 (0 = no activation checkpointing); "
                                "got " + std::to_string(options_.checkpoint_every));
  }
  for (at::ScalarType t : {options_.dtype, options_.compute_dtype.value_or(options_.dtype)}) {
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
  at::NoGradGuard no_grad;
  std::vector<ParameterSpec> const specs = parameter_specs(config_);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    init_parameter_rows(specs[i], config_.initializer_range, seed, /*row_begin=*/0, params_[i].second);
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

Qwen35ForCausalLM::LayerWeights Qwen35ForCausalLM::layer_weights(GroupWeights const& w, std::int64_t i) const {
  std::string const l = "model.layers." + std::to_string(i) + ".";
  auto get = [&](std::string const& name) -> at::Tensor const& {
    auto const it = w.find(l + name);
    if (it == w.end()) throw std::invalid_argument("Qwen35ForCausalLM: the weight source gave no '" + l + name + "'");
    return it->second;
  };
  LayerWeights lw;
  lw.type = config_.layer_types[i];
  lw.input_layernorm = get("input_layernorm.weight");
  lw.post_attention_layernorm = get("post_attention_layernorm.weight");
  if (lw.type == LayerType::kLinearAttention) {
    lw.linear_attn = {get("linear_attn.in_proj_qkv.weight"), get("linear_attn.in_proj_z.weight"),
                      get("linear_attn.in_proj_b.weight"),   get("linear_attn.in_proj_a.weight"),
                      get("linear_attn.conv1d.weight"),      get("linear_attn.dt_bias"),
                      get("linear_attn.A_log"),              get("linear_attn.norm.weight"),
                      get("linear_attn.out_proj.weight")};
  } else {
    lw.self_attn = {get("self_attn.q_proj.weight"), get("self_attn.k_proj.weight"), get("self_attn.v_proj.weight"),
                    get("self_attn.o_proj.weight"), get("self_attn.q_norm.weight"), get("self_attn.k_norm.weight")};
  }
  lw.mlp = {get("mlp.gate_proj.weight"), get("mlp.up_proj.weight"), get("mlp.down_proj.weight")};
  return lw;
}

ForwardOutput Qwen35ForCausalLM::forward(ModelBatch const& batch, ForwardOptions const& options) const {
  if (options_.device.is_meta()) {
    throw std::invalid_argument("Qwen35ForCausalLM::forward: the model is on the meta device (shapes only); pass a "
                                "WeightSource");
  }
  auto weights = std::make_shared<LocalWeights>(config_, params_, mixed_precision());
  return forward(batch, *weights, options, weights);
}

ForwardOutput Qwen35ForCausalLM::forward(ModelBatch const& batch, WeightSource& weights,
                                         ForwardOptions const& options) const {
  return forward(batch, weights, options, nullptr);
}

ForwardOutput Qwen35ForCausalLM::forward(ModelBatch const& batch, WeightSource& weights, ForwardOptions const& options,
                                         std::shared_ptr<WeightSource> owner) const {
  char const* const where = "Qwen35ForCausalLM::forward";
  if (!batch.tokens.defined() || batch.tokens.dim() != 1) {
    throw std::invalid_argument(std::string(where) + ": batch.tokens must be a 1-D [T] tensor (make_model_batch)");
  }
  c10::Device const device = weights.device();
  if (batch.tokens.device() != device || batch.cu_seqlens.device() != device) {
    std::ostringstream os;
    os << where << ": the batch is on " << batch.tokens.device() << " but the weights are on " << device;
    throw std::invalid_argument(os.str());
  }
  if (batch.max_token >= config_.vocab_size || batch.max_label >= config_.vocab_size) {
    throw std::invalid_argument(std::string(where) + ": the batch holds token id " +
                                std::to_string(std::max(batch.max_token, batch.max_label)) +
                                ", outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")");
  }
  ops::Backend const backend = options_.backend;
  double const eps = config_.rms_norm_eps;

  SequenceLayout const seq{batch.cu_seqlens, batch.position_ids, batch.max_seqlen};

  WeightGroup const embedding = WeightGroup::embedding();
  at::Tensor x_TH = at::embedding(weights.acquire(embedding).at("model.embed_tokens.weight"), batch.tokens);
  weights.release(embedding, at::Tensor());  // the embedding's backward reads the token ids, not the weight
  std::int64_t const every = options_.checkpoint_every;
  for (std::int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    // By value: a checkpointed layer runs again in the backward, after this frame is gone (the model and the source
    // outlive it; `owner` keeps a source made by forward itself).
    auto decoder_layer = [this, i, &weights, owner, seq, eps, backend](at::Tensor const& x, bool recomputing) {
      FUSEPACK_PROFILE_RANGE(range, FUSEPACK_RANGE_PREFIX "layer " + std::to_string(i) + " " +
                                        layer_type_name(config_.layer_types[i]));
      WeightGroup const group = WeightGroup::decoder_layer(i);
      LayerWeights const layer = layer_weights(weights.acquire(group, recomputing), i);
      at::Tensor const h_TH = ops::rmsnorm(x, layer.input_layernorm, eps, backend);
      at::Tensor y_TH = x + (layer.type == LayerType::kLinearAttention
                                 ? gated_deltanet(h_TH, layer.linear_attn, config_, seq, backend)
                                 : gated_attention(h_TH, layer.self_attn, config_, seq, backend));
      y_TH = y_TH + mlp(ops::rmsnorm(y_TH, layer.post_attention_layernorm, eps, backend), layer.mlp, backend);
      weights.release(group, y_TH, recomputing);
      return y_TH;
    };
    x_TH = every > 0 && i % every == 0 ? checkpointed(x_TH, decoder_layer) : decoder_layer(x_TH, false);
  }
  WeightGroup const head = WeightGroup::head();
  GroupWeights const hw = weights.acquire(head);
  at::Tensor const lm_head = hw.at(config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  at::Tensor const normed_TH = ops::rmsnorm(x_TH, hw.at("model.norm.weight"), eps, backend);
  ForwardOutput out;
  out.num_targets = batch.num_targets;
  at::Tensor logits_TV;
  if (!options.per_example_loss && !options.return_logits) {
    // The head and its loss as one op: with the fused backend in chunks of tokens, so the [T, vocab] logits (8 GB in
    // fp32 at T = 8192 with Qwen3.5's 248k vocabulary) never exist at once; the composite is the code below.
    // The labels were checked when the batch was made (-100 or the next token, ids >= 0) and above (< vocab_size).
    out.loss_sum = ops::linear_cross_entropy(normed_TH, lm_head, batch.labels, backend, /*chunk_tokens=*/0,
                                             /*labels_checked=*/true);
  } else {
    // HF upcasts the logits to fp32 for the loss; fp64 models stay fp64. Per-example sums and the logits themselves
    // need the whole [T, vocab] logits.
    logits_TV = at::linear(normed_TH, lm_head);
    at::ScalarType const loss_type = logits_TV.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    if (options.per_example_loss) {
      at::Tensor const token_loss_T =
          at::cross_entropy_loss(logits_TV.to(loss_type), batch.labels, {}, at::Reduction::None, kIgnoreIndex);
      out.loss_sum = token_loss_T.sum();
      out.example_loss_sums = at::zeros({batch.num_examples}, token_loss_T.options()).index_add(0, batch.seq_idx,
                                                                                                token_loss_T);
    } else {
      out.loss_sum =
          at::cross_entropy_loss(logits_TV.to(loss_type), batch.labels, {}, at::Reduction::Sum, kIgnoreIndex);
    }
  }
  weights.release(head, out.loss_sum);
  if (options.return_logits) out.logits = logits_TV;
  return out;
}

}  // namespace fusepack::model
