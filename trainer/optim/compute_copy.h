// The forward's copy of a master weight in its compute dtype (bf16 over fp32 masters), kept from one step to the
// next so that the forward need not cast every weight again at every step: AdamW writes it as it updates the master
// (kernels/optim: one more store in the same pass), the weights' source (trainer/model/weights.h) hands it out.
// Validity is checked, not trusted: `master_version` is the master's version counter when `value` was last made
// equal to master.to(value.dtype()), and the copy serves only while the counter still reads that. Every in-place
// change of a master (ATen's in-place operations, a checkpoint or weights loaded, fusepack's raw-pointer writers,
// which bump the counter as ATen would) makes it stale, and the next forward casts it again.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

namespace fusepack::optim {

struct ComputeCopy {
  at::Tensor value;                  // the master's shape and layout, in the compute dtype; undefined until first made
  std::int64_t master_version = -1;  // the master's _version() when `value` was made equal to it

  bool valid_for(at::Tensor const& master) const {
    return value.defined() && static_cast<std::int64_t>(master._version()) == master_version;
  }
};

// By Hugging Face parameter name; shared between the source that hands the copies out and the optimizer.
using ComputeCopies = std::unordered_map<std::string, std::shared_ptr<ComputeCopy>>;

}  // namespace fusepack::optim
