#include "trainer/optim/grad_clip.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <sstream>
#include <vector>

namespace fusepack::optim {

namespace {

std::string describe_norm(double norm) {
  std::ostringstream os;
  os << "gradient norm is " << norm;
  return os.str();
}

}  // namespace

NonFiniteGradNorm::NonFiniteGradNorm(double norm, std::string parameter)
    : std::runtime_error(describe_norm(norm) + (parameter.empty()
                                                    ? std::string("; every local gradient is finite, so another "
                                                                  "rank's is not")
                                                    : "; the first non-finite gradient is '" + parameter + "'")),
      norm_(norm),
      parameter_(std::move(parameter)) {}

double grad_norm(std::vector<NamedParameter> const& params, AllReduceSum const& all_reduce) {
  return queue_grad_norm(params, all_reduce).read(params);
}

QueuedGradNorm queue_grad_norm(std::vector<NamedParameter> const& params, AllReduceSum const& all_reduce) {
  check_parameters("grad_norm", params);
  QueuedGradNorm q;
  if (params.empty() && !all_reduce) return q;
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  at::Device const device = params.empty() ? at::Device(at::kCPU) : params.front().param.device();
  for (NamedParameter const& p : params) {
    at::Tensor const& g = p.param.grad();
    TORCH_CHECK(g.defined(), "grad_norm: parameter '", p.name, "' has no gradient; every registered parameter "
                "needs one at each step");
    TORCH_CHECK(g.layout() == at::kStrided, "grad_norm: the gradient of '", p.name, "' is not dense (layout ",
                g.layout(), ")");
    TORCH_CHECK(g.sizes() == p.param.sizes(), "grad_norm: the gradient of '", p.name, "' has shape ", g.sizes(),
                "; the parameter has ", p.param.sizes());
    grads.push_back(g);
  }
  // torch's foreach norm: one list operation per device and dtype, a norm per gradient in the gradient's dtype. A
  // group's norms are stacked and cast to fp64 on the first parameter's device in one copy, the groups joined, and
  // the squares summed in fp64: a fixed handful of launches, whatever the number of tensors.
  std::map<std::tuple<int, int, at::ScalarType>, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    at::Device const d = grads[i].device();
    groups[{static_cast<int>(d.type()), static_cast<int>(d.index()), grads[i].scalar_type()}].push_back(i);
  }
  for (auto const& [key, members] : groups) {
    std::vector<at::Tensor> list;
    for (std::size_t i : members) list.push_back(grads[i]);
    q.members_.push_back(members);
    q.group_norms_.push_back(at::stack(at::_foreach_norm(list, 2)).to(device, at::kDouble));
  }
  // One fp64 0-dim tensor: this rank's sum of squares, then (all-reduced) everyone's.
  q.sum_sq_ = q.group_norms_.empty()
                  ? at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device))
                  : (q.group_norms_.size() == 1 ? q.group_norms_.front() : at::cat(q.group_norms_)).square().sum();
  if (all_reduce) all_reduce(q.sum_sq_);
  q.parameters_ = params.size();
  return q;
}

double QueuedGradNorm::read(std::vector<NamedParameter> const& params) const {
  TORCH_CHECK(params.size() == parameters_, "QueuedGradNorm::read: the norm was queued over ", parameters_,
              " parameters; got a list of ", params.size());
  if (!sum_sq_.defined()) return 0;
  double const norm = std::sqrt(sum_sq_.item<double>());
  if (!std::isfinite(norm)) {
    // The first non-finite norm in registration order (groups are in dtype order): one copy to the host per group.
    std::size_t first = params.size();
    for (std::size_t k = 0; k < group_norms_.size(); ++k) {
      at::Tensor const host = group_norms_[k].cpu();
      double const* n = host.data_ptr<double>();
      for (std::size_t j = 0; j < members_[k].size(); ++j) {
        if (!std::isfinite(n[j])) first = std::min(first, members_[k][j]);
      }
    }
    throw NonFiniteGradNorm(norm, first < params.size() ? params[first].name : std::string());
  }
  return norm;
}

namespace {

void check_max_norm(char const* who, double max_norm) {
  TORCH_CHECK(std::isfinite(max_norm) && max_norm > 0, who, ": max_norm must be finite and > 0; got ", max_norm,
              " (to log the norm without clipping, call grad_norm)");
}

}  // namespace

double clip_factor(double norm, double max_norm) {
  check_max_norm("clip_factor", max_norm);
  TORCH_CHECK(std::isfinite(norm) && norm >= 0, "clip_factor: the norm must be finite and >= 0; got ", norm);
  double const factor = max_norm / (norm + kClipEps);
  return factor < 1 ? factor : 1.0;
}

double clip_grad_norm(std::vector<NamedParameter> const& params, double max_norm, AllReduceSum const& all_reduce) {
  check_max_norm("clip_grad_norm", max_norm);
  double const norm = grad_norm(params, all_reduce);
  double const factor = clip_factor(norm, max_norm);
  if (factor < 1) {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    for (NamedParameter const& p : params) grads.push_back(p.param.grad());
    at::_foreach_mul_(grads, factor);
  }
  return norm;
}

}  // namespace fusepack::optim
