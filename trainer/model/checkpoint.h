// Activation checkpointing: a function of one tensor run without keeping its activations, and run again in the
// backward to get them (PyTorch's reentrant checkpoint, torch.utils.checkpoint with use_reentrant=True). No random
// state is saved or restored: no op of the model draws random numbers, so the recomputation repeats the forward to the
// bit.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace fusepack::model {

// fn(x, recomputing): the function to checkpoint; `recomputing` is false in the forward and true when the backward
// runs it again (a sharded weight source then keeps its gathered weights for the backward that follows at once).
using CheckpointedFunction = std::function<at::Tensor(at::Tensor const& x, bool recomputing)>;

// fn(x) computed without recording its graph. When grad mode is on and x requires grad, the result's backward runs
// fn again on a detached copy of x with the graph recorded, backpropagates the incoming gradient through it (the
// parameters fn reads get their gradients there) and passes x's gradient on. Otherwise: fn(x, false). `fn` and what
// it refers to must live until the backward.
at::Tensor checkpointed(at::Tensor const& x, CheckpointedFunction fn);

}  // namespace fusepack::model
