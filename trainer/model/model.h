// Qwen35ForCausalLM: the dense Qwen3.5 text model, single-device, with Hugging Face parameter names (parameters.h),
// on a packed batch (batch.h): embed → [pre-norm mixer + pre-norm MLP] × layers → zero-centred norm → lm_head → summed
// token cross-entropy. Sharding, checkpoint files and the training loop are applied from outside: the forward reads
// its weights from a WeightSource (weights.h), by default the model's own parameters.
#pragma once

#include "kernels/ops/backend.h"
#include "trainer/model/batch.h"
#include "trainer/model/config.h"
#include "trainer/model/layers.h"
#include "trainer/model/parameters.h"
#include "trainer/model/weights.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fusepack::model {

struct ModelOptions {
  // Dtype of the parameters (the master weights the optimizer updates): fp64 or fp32.
  at::ScalarType dtype = at::kFloat;
  // Dtype the forward runs in over the model's own parameters (the param_dtype of their LocalWeights policy). Unset =
  // `dtype`. A_log and dt_bias stay in `dtype` (MixedPrecisionPolicy::keeps_master_dtype).
  std::optional<at::ScalarType> compute_dtype;
  // at::kMeta allocates nothing: names and shapes only (init refused; forward only from another WeightSource, e.g.
  // the shards of trainer/parallel).
  c10::Device device = c10::kCPU;
  ops::Backend backend = ops::Backend::kComposite;
  std::uint64_t seed = 0;  // init_parameters' seed
  // Activation checkpointing (checkpoint.h): 0 keeps every layer's activations for the backward; N >= 1 checkpoints
  // layers 0, N, 2N, ... (1: every layer), which keep only their input and run their forward again in the backward.
  // The gradients are the same to the bit.
  std::int64_t checkpoint_every = 0;
};

struct ForwardOptions {
  bool per_example_loss = false;  // also return each example's loss sum
  bool return_logits = false;     // also return the logits (tests)
};

struct ForwardOutput {
  // Σ over targets of −log softmax(logits[t])[labels[t]]: a scalar in fp32 (fp64 for fp64 compute), differentiable.
  // docs/contracts.md, batches: the trainer divides by the number of targets of the whole optimizer step (all
  // micro-batches and ranks), so the model returns the sum and its own count, never a mean.
  at::Tensor loss_sum;
  std::int64_t num_targets = 0;    // labels != -100 in this batch
  at::Tensor example_loss_sums;    // [N] per example (per row of a padded batch), loss_sum's dtype; when asked
  at::Tensor logits;               // [T, vocab] in the compute dtype; when asked
};

class Qwen35ForCausalLM {
 public:
  // Validates the config, allocates every parameter_specs() tensor and, unless on the meta device, fills it with
  // init_parameters(options.seed). Parameters require grad.
  Qwen35ForCausalLM(Qwen35Config config, ModelOptions options = {});
  // Not copyable: a copy would share the parameter tensors (at::Tensor is a handle) and look independent.
  Qwen35ForCausalLM(Qwen35ForCausalLM const&) = delete;
  Qwen35ForCausalLM& operator=(Qwen35ForCausalLM const&) = delete;
  Qwen35ForCausalLM(Qwen35ForCausalLM&&) = default;
  Qwen35ForCausalLM& operator=(Qwen35ForCausalLM&&) = default;

  Qwen35Config const& config() const { return config_; }
  ModelOptions const& options() const { return options_; }
  ops::Backend backend() const { return options_.backend; }
  void set_backend(ops::Backend backend) { options_.backend = backend; }

  // In parameter_specs() order, with Hugging Face names; the tensors are the live parameters (leaves).
  NamedParameters const& named_parameters() const { return params_; }
  std::vector<at::Tensor> parameters() const;
  at::Tensor const& parameter(std::string const& name) const;  // throws std::invalid_argument for an unknown name
  std::int64_t num_parameters() const;

  // Deterministic from `seed`: every element is a function of the seed, the parameter's name and the element's
  // index alone (init_parameter_rows, init.h), generated on the parameters' device and rounded to their dtype (so an
  // fp32 model holds the fp64 model's values rounded, and a rank's shard holds the same rows as the whole model).
  // Rules: see ParameterInit (parameters.h).
  void init_parameters(std::uint64_t seed);

  // Copies a name → tensor map into the parameters (no autograd). Every parameter must be given exactly once with
  // its shape; a name the model does not have is an error. dtype must match unless convert_dtype (a bf16 checkpoint
  // into fp32 master weights). All problems are collected and thrown together as one std::invalid_argument before
  // anything is copied ("load_state: missing [...]; unexpected [...]; mis-shaped [model.norm.weight expected [64] got
  // [32]]; wrong dtype [...]"). Names are Qwen3_5ForCausalLM's: the checkpoint reader maps the VLM's
  // "model.language_model." prefix to "model." and drops model.visual.* and mtp.* before calling this.
  void load_state(std::map<std::string, at::Tensor> const& state, bool convert_dtype = false);

  // Loss (and optionally more) of one batch over the model's own parameters (LocalWeights with compute_dtype).
  // Throws std::invalid_argument when the batch is on another device or holds a token or label outside the
  // vocabulary, or the model is on the meta device.
  ForwardOutput forward(ModelBatch const& batch, ForwardOptions const& options = {}) const;
  // The same over weights from `weights` (the model's own parameters are not read; the model may be on meta). The
  // batch must be on weights.device(). With activation checkpointing, the model and `weights` must live until the
  // backward has run.
  ForwardOutput forward(ModelBatch const& batch, WeightSource& weights, ForwardOptions const& options = {}) const;

  MixedPrecisionPolicy mixed_precision() const { return {options_.compute_dtype, std::nullopt}; }

  // Decoder layer `layer`'s weights out of its group's name → weight map (WeightSource::acquire), by kind.
  struct LayerWeights {
    LayerType type;
    at::Tensor input_layernorm, post_attention_layernorm;  // [H] zero-centred
    GatedDeltaNetWeights linear_attn;                      // when type == kLinearAttention
    AttentionWeights self_attn;                            // when type == kFullAttention
    MlpWeights mlp;
  };
  LayerWeights layer_weights(GroupWeights const& w, std::int64_t layer) const;

 private:
  // forward(batch, weights, options), keeping `owner` (the source, when forward made it) alive for recomputations.
  ForwardOutput forward(ModelBatch const& batch, WeightSource& weights, ForwardOptions const& options,
                        std::shared_ptr<WeightSource> owner) const;

  Qwen35Config config_;
  ModelOptions options_;
  NamedParameters params_;
  std::unordered_map<std::string, std::size_t> index_;  // name → position in params_
};

}  // namespace fusepack::model
