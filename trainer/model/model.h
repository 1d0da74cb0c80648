// Qwen35ForCausalLM: the dense Qwen3.5 text model, single-device, with Hugging Face parameter names (parameters.h),
// on a packed batch (batch.h): embed → [pre-norm mixer + pre-norm MLP] × layers → zero-centred norm → lm_head → summed
// token cross-entropy. Sharding, checkpoint files and the training loop are applied from outside.
#pragma once

#include "kernels/ops/backend.h"
#include "trainer/model/batch.h"
#include "trainer/model/config.h"
#include "trainer/model/layers.h"
#include "trainer/model/parameters.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fusepack::model {

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

struct ModelOptions {
  // Dtype of the parameters (the master weights the optimizer updates): fp64 or fp32 on the CPU.
  at::ScalarType dtype = at::kFloat;
  // Dtype the forward runs in. Unset = `dtype`. This is the one place where bf16 compute over fp32 master weights
  // plugs in: Qwen35ForCausalLM::compute_weights() casts the parameters to it (differentiably, so gradients reach the
  // master weights in their own dtype; A_log and dt_bias are read in the master dtype by the fp32 decay math) and the
  // embeddings come out in it.
  std::optional<at::ScalarType> compute_dtype;
  // at::kMeta allocates nothing: names and shapes only (init and forward are refused).
  c10::Device device = c10::kCPU;
  ops::Backend backend = ops::Backend::kComposite;
  std::uint64_t seed = 0;  // init_parameters' seed
};

// Leaky variants, only for tests that must show the no-leak tests can fail; a training run never sets one.
enum class PlantedLeak {
  kNone,
  kGatedDeltaNetSpansPack,  // the DeltaNet layers (conv1d and delta rule) see one example spanning the whole pack
  kAttentionSpansPack,      // the attention layers see one example spanning the whole pack (positions still reset)
};

struct ForwardOptions {
  bool per_example_loss = false;  // also return each example's loss sum
  bool return_logits = false;     // also return the logits (tests)
  PlantedLeak planted_leak = PlantedLeak::kNone;
};

struct ForwardOutput {
  // Σ over targets of −log softmax(logits[t])[labels[t]]: a scalar in fp32 (fp64 for fp64 compute), differentiable.
  // DESIGN section 3: the trainer divides by the number of targets of the whole optimizer step (all micro-batches and
  // ranks), so the model returns the sum and its own count, never a mean.
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

  // Deterministic from `seed` whatever the dtype and device: every parameter is drawn in fp64 on the CPU from one
  // generator, in named_parameters() order, then rounded to the model dtype and copied (so an fp32 model holds the
  // fp64 model's values rounded). Rules: see ParameterInit (parameters.h).
  void init_parameters(std::uint64_t seed);

  // Copies a name → tensor map into the parameters (no autograd). Every parameter must be given exactly once with
  // its shape; a name the model does not have is an error. dtype must match unless convert_dtype (a bf16 checkpoint
  // into fp32 master weights). All problems are collected and thrown together as one std::invalid_argument before
  // anything is copied ("load_state: missing [...]; unexpected [...]; mis-shaped [model.norm.weight expected [64] got
  // [32]]; wrong dtype [...]"). Names are Qwen3_5ForCausalLM's: the checkpoint reader maps the VLM's
  // "model.language_model." prefix to "model." and drops model.visual.* and mtp.* before calling this.
  void load_state(std::map<std::string, at::Tensor> const& state, bool convert_dtype = false);

  // Loss (and optionally more) of one batch. Throws std::invalid_argument when the batch is on another device or
  // holds a token or label outside the vocabulary.
  ForwardOutput forward(ModelBatch const& batch, ForwardOptions const& options = {}) const;

 private:
  struct LayerWeights {
    LayerType type;
    at::Tensor input_layernorm, post_attention_layernorm;  // [H] zero-centred
    GatedDeltaNetWeights linear_attn;                      // when type == kLinearAttention
    AttentionWeights self_attn;                            // when type == kFullAttention
    MlpWeights mlp;
  };
  struct Weights {
    at::Tensor embed_tokens;  // [vocab, H]
    std::vector<LayerWeights> layers;
    at::Tensor norm;     // [H] zero-centred
    at::Tensor lm_head;  // [vocab, H]; embed_tokens when tied
  };
  Weights master_weights() const;   // the parameters themselves
  // Cast to the compute dtype (identity when it equals the parameter dtype), except A_log and dt_bias (fp32 math).
  Weights compute_weights() const;
  at::ScalarType compute_dtype() const { return options_.compute_dtype.value_or(options_.dtype); }

  Qwen35Config config_;
  ModelOptions options_;
  NamedParameters params_;
  std::unordered_map<std::string, std::size_t> index_;  // name → position in params_
};

}  // namespace fusepack::model
