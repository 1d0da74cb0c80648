// What the optimizer, gradient clipping and loss normalisation share: a parameter with its Hugging Face name, and
// the callback through which a data-parallel trainer sums a small tensor over its ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace fusepack::optim {

// One trainable tensor: an fp32 master weight (or fp64 in tests), or this rank's shard of one. Its gradient is
// param.grad(), as in torch.optim; the tensors are shared with the model (in-place updates are seen by it).
struct NamedParameter {
  std::string name;  // Hugging Face name, e.g. "model.language_model.layers.0.linear_attn.A_log"
  at::Tensor param;  // any shape; fp32 or fp64
};

// Sums `t` over the ranks of the data-parallel group, in place (c10d all-reduce SUM). `t` is a 0-dim or 1-dim tensor
// on the device where the values were computed: counts on the CPU, norms on the gradients' device; a callback for a
// backend that needs another device (NCCL) copies there and back. An empty AllReduceSum means one rank.
using AllReduceSum = std::function<void(at::Tensor& t)>;

// Throws c10::Error when two entries share a name or are the same tensor (tied weights are registered once) or a
// parameter is undefined, not floating fp32/fp64, or sparse. `who` starts each message ("AdamW", "clip_grad_norm").
void check_parameters(char const* who, std::vector<NamedParameter> const& params);

}  // namespace fusepack::optim
