// The no-leak properties of docs/contracts.md, no leakage for any op over a packed batch, written once against the
// PackedOp interface: the fp64 references implement it here, GPU kernels can implement it in their tests. Each property
// draws a random packing (and activations from a seed) inside a RapidCheck case and asserts with RC_ASSERT/RC_FAIL:
//   isolation               every example's outputs and input gradients in the pack equal those computed alone;
//   perturbation invariance replacing example j (new values, possibly a new length) leaves every other example's
//                           outputs and input gradients bitwise unchanged;
//   zero cross-gradient     with an output gradient nonzero only on example i, every other example's input gradients
//                           are exactly 0.
// Shared parameters (conv weights, scales) belong to the op, not to any example, and are not compared.
#pragma once

#include "properties/gen/packings.h"
#include "reference/tensor.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fusepack::props {

// Tensors of a packed batch by the dimension that indexes the batch: token tensors [T, ...] and example tensors
// [N, ...] (initial/final states). An undefined tensor is an absent optional argument and stays undefined.
struct PackTensors {
  std::vector<ref::Tensor> token;
  std::vector<ref::Tensor> example;
};

class PackedOp {
 public:
  virtual ~PackedOp() = default;
  virtual std::string name() const = 0;
  // Names of the entries of the forward's inputs and outputs (token entries, then example entries), for messages.
  virtual std::vector<std::string> input_names() const = 0;
  virtual std::vector<std::string> output_names() const = 0;
  // The inputs of one example of `length` tokens (example tensors with one row), drawn from `seed`.
  virtual PackTensors example_inputs(ref::Index length, std::uint64_t seed) const = 0;
  virtual PackTensors forward(PackTensors const& in, std::vector<std::int32_t> const& cu_seqlens) const = 0;
  // The gradient of Σ dout·forward(in) with respect to `in`, laid out like `in`.
  virtual PackTensors backward(PackTensors const& dout, PackTensors const& in,
                               std::vector<std::int32_t> const& cu_seqlens) const = 0;
};

// How far isolation may be off: 0 = bitwise (the references compute an example with the same operations in the same
// order whatever surrounds it). Perturbation invariance and zero cross-gradients are always exact.
struct IsolationTolerance {
  double atol = 0;
  double rtol = 0;
};

void check_isolation(PackedOp const& op, PackingLimits const& limits, IsolationTolerance tol = {});
void check_perturbation_invariance(PackedOp const& op, PackingLimits const& limits);
void check_zero_cross_gradient(PackedOp const& op, PackingLimits const& limits);

// A planted leak for ops that mix tokens along the sequence: `inner` run over the whole pack as one sequence,
// cu_seqlens {0, T}, as a kernel that ignores the example boundaries would (conv taps reach into the previous example,
// attention is plain causal over the pack). Example tensors: the first example's initial state starts the sequence
// (the others' are ignored); a final state of the whole sequence is reported as the last example's.
class PackWideOp : public PackedOp {
 public:
  explicit PackWideOp(std::shared_ptr<PackedOp const> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name() + " over the pack as one sequence"; }
  std::vector<std::string> input_names() const override { return inner_->input_names(); }
  std::vector<std::string> output_names() const override { return inner_->output_names(); }
  PackTensors example_inputs(ref::Index length, std::uint64_t seed) const override {
    return inner_->example_inputs(length, seed);
  }
  PackTensors forward(PackTensors const& in, std::vector<std::int32_t> const& cu_seqlens) const override;
  PackTensors backward(PackTensors const& dout, PackTensors const& in,
                       std::vector<std::int32_t> const& cu_seqlens) const override;

 private:
  std::shared_ptr<PackedOp const> inner_;
};

// Rows [start, start + count) of t along dimension 0; an undefined t stays undefined.
ref::Tensor rows(ref::Tensor const& t, ref::Index start, ref::Index count);
// The tensors concatenated along dimension 0 (all defined or all undefined).
ref::Tensor cat_rows(std::vector<ref::Tensor> const& parts);

}  // namespace fusepack::props
