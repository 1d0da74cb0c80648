// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_: the norm over every gradient of every
// rank, and when max_norm / (norm + 1e-6) < 1 every gradient is scaled by that factor. Returns the norm before
// clipping. Per-gradient norms are taken in the gradient's dtype (torch's foreach norm), their squares summed in
// fp64, so the result matches torch's to the rounding of its fp32 norm-of-norms.
#pragma once

#include "trainer/optim/parameters.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace fusepack::optim {

// The norm is NaN or infinite. torch would scale every gradient by NaN and the step would silently write NaN into
// the weights; here the caller decides (stop, or skip the step). `parameter()` names the first local gradient with
// a non-finite norm, or is empty when the non-finite part came from another rank.
class NonFiniteGradNorm : public std::runtime_error {
 public:
  NonFiniteGradNorm(double norm, std::string parameter);
  double norm() const { return norm_; }
  std::string const& parameter() const { return parameter_; }

 private:
  double norm_;
  std::string parameter_;
};

inline constexpr double kClipEps = 1e-6;  // torch's: the factor is max_norm / (norm + 1e-6)

// sqrt(Σ over ranks and parameters of ||grad||²). Every parameter must have a gradient of its own shape (an error
// naming it otherwise). `all_reduce` sums this rank's Σ||grad||² (an fp64 0-dim tensor on the first gradient's
// device) with the other ranks'; empty for one rank. Throws NonFiniteGradNorm.
double grad_norm(std::vector<NamedParameter> const& params, AllReduceSum const& all_reduce = {});

// grad_norm in two halves, for a caller with more to queue before it waits: queue_grad_norm checks the gradients and
// queues the norm's kernels and its all-reduce without reading anything back; read(params), with the same params,
// waits for them and returns the norm, or throws NonFiniteGradNorm naming the parameter. The same operations and
// result as grad_norm.
class QueuedGradNorm {
 public:
  double read(std::vector<NamedParameter> const& params) const;

 private:
  friend QueuedGradNorm queue_grad_norm(std::vector<NamedParameter> const&, AllReduceSum const&);
  std::size_t parameters_ = 0;                       // how many params were queued (read checks its list against it)
  at::Tensor sum_sq_;                                // fp64 0-dim; undefined: no parameter, norm 0
  std::vector<at::Tensor> group_norms_;              // per dtype group: the members' norms (fp64)
  std::vector<std::vector<std::size_t>> members_;    // per group: indices into params
};
QueuedGradNorm queue_grad_norm(std::vector<NamedParameter> const& params, AllReduceSum const& all_reduce = {});

// The factor clipping scales every gradient by: max_norm / (norm + 1e-6) when that is < 1, else exactly 1. max_norm
// > 0, norm finite and >= 0. AdamW::step takes it as its grad_scale, so clipping needs no pass of its own.
double clip_factor(double norm, double max_norm);

// grad_norm, then grads ← grads · max_norm / (norm + 1e-6) when that factor is < 1 (torch's clamp at 1: gradients
// are left bit-for-bit alone otherwise). max_norm > 0. Returns the norm before clipping.
double clip_grad_norm(std::vector<NamedParameter> const& params, double max_norm, AllReduceSum const& all_reduce = {});

}  // namespace fusepack::optim
