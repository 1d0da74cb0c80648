// Where the forward gets its weights: the seam through which sharding is applied to the model from outside. The
// forward asks a WeightSource for one group of weights at a time (the embedding, one decoder layer, the head) and
// tells it when the group's last forward use is over; the source decides where the values come from (the local
// master weights, or shards all-gathered from every rank) and in which dtype (its MixedPrecisionPolicy).
#pragma once

#include "trainer/model/config.h"
#include "trainer/optim/compute_copy.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fusepack::model {

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// The weights the forward uses together, in the order it uses them: the embedding, layer 0 ... layer L-1, the head.
struct WeightGroup {
  enum class Kind { kEmbedding, kLayer, kHead };
  Kind kind = Kind::kEmbedding;
  std::int64_t layer = -1;  // kLayer: the decoder layer

  static WeightGroup embedding() { return {Kind::kEmbedding, -1}; }
  static WeightGroup decoder_layer(std::int64_t i) { return {Kind::kLayer, i}; }
  static WeightGroup head() { return {Kind::kHead, -1}; }
  std::string str() const;  // "embedding", "layer 3", "head"
  bool operator==(WeightGroup const& o) const { return kind == o.kind && layer == o.layer; }
  bool operator!=(WeightGroup const& o) const { return !(*this == o); }
};

// Every group in forward order.
std::vector<WeightGroup> weight_groups(Qwen35Config const& config);

// The Hugging Face names of the parameters the forward reads for `group`: the embedding's model.embed_tokens.weight;
// every model.layers.<i>.* parameter; the head's model.norm.weight and lm_head.weight, or model.embed_tokens.weight
// in its place when tie_word_embeddings (the head then reads the embedding matrix again).
std::vector<std::string> group_parameter_names(Qwen35Config const& config, WeightGroup const& group);

// Name → weight as the forward reads it (compute dtype, differentiable back to the owner's trainable tensors).
using GroupWeights = std::unordered_map<std::string, at::Tensor>;

// Mixed precision as PyTorch FSDP2's MixedPrecisionPolicy: the trainable (master) tensors keep their dtype (fp32, or
// fp64 in tests), the forward computes in param_dtype, gradients are reduced across ranks in reduce_dtype.
struct MixedPrecisionPolicy {
  std::optional<at::ScalarType> param_dtype;   // unset: the master dtype (no cast)
  std::optional<at::ScalarType> reduce_dtype;  // unset: the master dtype

  // A_log and dt_bias enter only the Gated DeltaNet's decay, which is computed in fp32 (fp64 for fp64 activations)
  // whatever the compute dtype: they are read in the master dtype, since rounding them to bf16 first loses bits the
  // decay math keeps.
  static bool keeps_master_dtype(std::string const& name);
  // The dtype the forward reads parameter `name` in, for master weights of dtype `master`.
  at::ScalarType compute_dtype(std::string const& name, at::ScalarType master) const;
  at::ScalarType reduce(at::ScalarType master) const { return reduce_dtype.value_or(master); }
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // The weights of `group`, every name of group_parameter_names, in the policy's compute dtype. Called in forward
  // order (`recomputing`: by activation checkpointing in the backward, where the order is the backward's); a source
  // that gathers may block until they are there.
  virtual GroupWeights acquire(WeightGroup const& group, bool recomputing = false) = 0;
  // The forward's last use of `group` is over. `output` is the tensor that carries the group's result (the residual
  // stream after a layer): the group's backward runs after `output`'s gradient is complete, so a source that frees
  // gathered weights after the forward gathers them again from there. An undefined `output` says the group's backward
  // reads none of its weights (the embedding's backward needs only the token ids). `recomputing`: this forward is
  // activation checkpointing's recomputation in the backward, whose own backward follows at once (keep the weights).
  virtual void release(WeightGroup const& group, at::Tensor const& output, bool recomputing = false) {
    (void)group;
    (void)output;
    (void)recomputing;
  }
  // Called after each backward: returns when every gradient of that backward is in the trainable tensors' .grad.
  virtual void finish_backward() {}
  // Where the weights live (and the batches must).
  virtual c10::Device device() const = 0;
  // The compute copies this source keeps between steps, for the optimizer to write as it updates the masters
  // (optim/compute_copy.h); empty for a source that keeps none.
  virtual optim::ComputeCopies compute_copies() const { return {}; }
};

// The default source: a model's own parameters (the master weights, all on one device), cast to the compute dtype
// differentiably, so their gradients land in the masters' .grad in the master dtype.
// The casts are kept between steps as compute copies (optim/compute_copy.h): a copy still valid for its master is
// handed out as it is, the stale ones of a group are cast again in one multi-tensor copy (ATen's _foreach_copy_, a
// few kernel launches per group on CUDA). Either way the weights' backward casts the gradients back to the masters'
// dtype the same way, instead of a cast and a cast-back per parameter. A tied weight is one copy for both its uses.
class LocalWeights final : public WeightSource {
 public:
  // `params` must hold every name of parameter_specs(config); the tensors are shared, not copied.
  LocalWeights(Qwen35Config const& config, NamedParameters const& params, MixedPrecisionPolicy policy);

  GroupWeights acquire(WeightGroup const& group, bool recomputing = false) override;
  c10::Device device() const override { return device_; }
  optim::ComputeCopies compute_copies() const override;

 private:
  struct Member {
    std::string name;
    at::Tensor master;
    at::ScalarType compute_dtype;
    std::shared_ptr<optim::ComputeCopy> copy;  // set when compute_dtype differs from the master's
  };
  Qwen35Config const& config_;
  std::vector<std::vector<Member>> groups_;  // forward order: embedding, layer 0 ... layer L-1, head
  c10::Device device_ = c10::kCPU;
};

// `masters` cast to `dtype` as one multi-tensor copy whose backward casts the gradients back to each master's dtype
// the same way: the values and gradients of `t.to(dtype)` per tensor, to the bit. The masters share one dtype.
std::vector<at::Tensor> cast_tensors(at::TensorList masters, at::ScalarType dtype);

// The same, with the values taken from `copies` (each valid for its master: optim::ComputeCopy) instead of cast:
// the outputs share the copies' storage; the backward is cast_tensors'.
std::vector<at::Tensor> cast_tensors_from_copies(at::TensorList masters, std::vector<at::Tensor> const& copies);

}  // namespace fusepack::model
