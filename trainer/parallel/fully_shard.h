// PyTorch FSDP2 (fully_shard) semantics for Qwen35ForCausalLM, applied from outside the model as its WeightSource:
//  - every parameter is sharded on dim 0 across the ranks (ShardLayout: ceil-sized row slices, zero-padded so every
//    rank exchanges the same count; uneven sizes and empty shards are fine); a rank holds only its rows, in the
//    master dtype (fp32, fp64 in tests), and they are what the optimizer updates (parameters());
//  - the forward's groups are gathered one unit at a time: one all-gather per decoder layer, one for the embedding and
//    one for the head (embedding and head are one unit when the config ties them), in the policy's compute dtype
//    (bf16 for bf16 runs; A_log and dt_bias keep the master dtype);
//  - after its forward a unit is freed again (reshard_after_forward; the head, first in the backward, is kept) and
//    gathered anew when the backward reaches it;
//  - gradients are reduce-scattered as a SUM in the reduce dtype (fp32) and added to the shards' .grad: the loss is
//    already divided by the step's global target count, so the sum over ranks is the gradient of the step's loss;
//  - on CUDA the next unit's all-gather and the last unit's reduce-scatter run on side streams of their own, so they
//    overlap compute; on the CPU (Gloo) every collective is synchronous.
#pragma once

#include "trainer/model/config.h"
#include "trainer/model/weights.h"
#include "trainer/optim/parameters.h"
#include "trainer/parallel/shard_layout.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fusepack::parallel {

class Collectives;

struct FullyShardOptions {
  at::ScalarType master_dtype = at::kFloat;     // the shards, their gradients and the optimizer state
  model::MixedPrecisionPolicy mixed_precision;  // param_dtype: gathered/compute dtype; reduce_dtype: reduce-scatter's
  // Free a unit's gathered weights after its forward and gather them again for its backward (FSDP2's default, ZeRO-3);
  // false keeps them from the forward to the backward (ZeRO-2: less traffic, the whole model's weights in memory).
  bool reshard_after_forward = true;
};

// Reads rows [begin, end) of parameter `name` (a CPU tensor [end - begin, ...] of any floating dtype).
using RowReader = std::function<at::Tensor(std::string const& name, std::int64_t begin, std::int64_t end)>;

class FullyShardedWeights final : public model::WeightSource {
 public:
  // Allocates this rank's shard of every parameter_specs(config) parameter on comm->device() (uninitialised: call
  // init_parameters or load_rows next).
  FullyShardedWeights(model::Qwen35Config config, std::shared_ptr<Collectives> comm, FullyShardOptions options);
  ~FullyShardedWeights() override;
  FullyShardedWeights(FullyShardedWeights const&) = delete;
  FullyShardedWeights& operator=(FullyShardedWeights const&) = delete;

  // This rank's rows of the model's initial parameters: the rows Qwen35ForCausalLM::init_parameters(seed) gives the
  // whole model, generated on this rank's device only (init_parameter_rows).
  void init_parameters(std::uint64_t seed);
  // This rank's rows of every parameter from `read`. Every problem (a shape or dtype the reader cannot give) is
  // collected and thrown together as one std::invalid_argument before anything is copied.
  void load_rows(RowReader const& read);

  // This rank's shards (unpadded), with Hugging Face names, in parameter_specs order: what the optimizer, clipping and
  // checkpoints see. Their .grad holds the reduced gradient after finish_backward().
  std::vector<optim::NamedParameter> parameters() const;
  std::int64_t num_parameters() const;  // of the whole model
  ShardLayout const& layout(std::string const& name) const;

  // The whole parameter in the master dtype, on every rank. Collective: every rank calls it for the same names in the
  // same order.
  at::Tensor gather_parameter(std::string const& name);

  model::GroupWeights acquire(model::WeightGroup const& group, bool recomputing = false) override;
  void release(model::WeightGroup const& group, at::Tensor const& output, bool recomputing = false) override;
  void finish_backward() override;
  c10::Device device() const override;

  // How many all-gathers and reduce-scatters ran so far (tests check the schedule: one per unit and pass).
  std::int64_t all_gathers() const;
  std::int64_t reduce_scatters() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusepack::parallel
