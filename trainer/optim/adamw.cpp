#include "trainer/optim/adamw.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <map>
#include <optional>
#include <regex>
#include <tuple>

namespace fusepack::optim {

bool hf_trainer_decays(std::string const& name) {
  // transformers' forbidden_name_patterns, searched in the lower-cased name.
  static std::regex const patterns[] = {std::regex("bias"), std::regex("layernorm"), std::regex("rmsnorm"),
                                        std::regex(R"((^|\.)norm($|\.))"), std::regex(R"(_norm($|\.))")};
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (std::regex const& p : patterns) {
    if (std::regex_search(lower, p)) return false;
  }
  return true;
}

bool qwen35_decays(std::string const& name) {
  static std::regex const a_log(R"((^|\.)A_log$)");
  return hf_trainer_decays(name) && !std::regex_search(name, a_log);
}

void AdamWOptions::validate() const {
  TORCH_CHECK(beta1 >= 0 && beta1 < 1, "AdamW: beta1 must be in [0, 1); got ", beta1);
  TORCH_CHECK(beta2 >= 0 && beta2 < 1, "AdamW: beta2 must be in [0, 1); got ", beta2);
  TORCH_CHECK(eps >= 0, "AdamW: eps must be >= 0; got ", eps);
  TORCH_CHECK(weight_decay >= 0, "AdamW: weight_decay must be >= 0; got ", weight_decay);
  TORCH_CHECK(static_cast<bool>(decays), "AdamW: the weight-decay rule (decays) is empty");
}

AdamW::AdamW(std::vector<NamedParameter> params, AdamWOptions options)
    : params_(std::move(params)), options_(std::move(options)) {
  options_.validate();
  check_parameters("AdamW", params_);
  decay_.reserve(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    decay_.push_back(options_.decays(params_[i].name));
    index_.emplace(params_[i].name, i);
  }
  state_.resize(params_.size());
  std::map<std::tuple<int, int, at::ScalarType, bool>, std::size_t> group_of;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor const& p = params_[i].param;
    auto const key = std::make_tuple(static_cast<int>(p.device().type()), static_cast<int>(p.device().index()),
                                     p.scalar_type(), static_cast<bool>(decay_[i]));
    auto const [it, added] = group_of.emplace(key, groups_.size());
    if (added) groups_.emplace_back();
    groups_[it->second].push_back(i);
  }
}

void AdamW::step(double lr) {
  TORCH_CHECK(std::isfinite(lr) && lr >= 0, "AdamW::step: lr must be finite and >= 0; got ", lr);
  // Check every gradient before touching any parameter, so a bad one leaves the model as it was.
  for (NamedParameter const& p : params_) {
    at::Tensor const& g = p.param.grad();
    TORCH_CHECK(g.defined(), "AdamW::step: parameter '", p.name, "' has no gradient; every registered parameter "
                "needs one at each step (register only trainable parameters)");
    TORCH_CHECK(g.layout() == at::kStrided, "AdamW::step: the gradient of '", p.name, "' is not dense (layout ",
                g.layout(), ")");
    TORCH_CHECK(g.sizes() == p.param.sizes(), "AdamW::step: the gradient of '", p.name, "' has shape ", g.sizes(),
                "; the parameter has ", p.param.sizes());
    TORCH_CHECK(g.scalar_type() == p.param.scalar_type(), "AdamW::step: the gradient of '", p.name, "' has dtype ",
                g.scalar_type(), "; the parameter has ", p.param.scalar_type());
    TORCH_CHECK(g.device() == p.param.device(), "AdamW::step: the gradient of '", p.name, "' is on ", g.device(),
                "; the parameter is on ", p.param.device());
  }
  c10::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    AdamWState& s = state_[i];
    if (s.step == 0) {
      s.exp_avg = at::zeros_like(params_[i].param, at::MemoryFormat::Preserve);
      s.exp_avg_sq = at::zeros_like(params_[i].param, at::MemoryFormat::Preserve);
    }
    s.step += 1;
  }
  std::vector<std::pair<std::vector<std::size_t>, bool>> lists;  // members, decayed
  for (std::vector<std::size_t> const& group : groups_) {
    std::map<std::int64_t, std::vector<std::size_t>> by_step;
    for (std::size_t i : group) by_step[state_[i].step].push_back(i);
    for (auto& [step, members] : by_step) lists.emplace_back(std::move(members), decay_[group.front()]);
  }
  for (auto const& [members, decayed] : lists) {
    at::Device const device = params_[members.front()].param.device();
    bool const fused = options_.kernel == AdamWKernel::kFused ||
                       (options_.kernel == AdamWKernel::kAuto && device.is_cuda());
    // The fused kernel takes only members whose p, g, m and v are dense with one layout (ATen's fast-path rule, a
    // TORCH_CHECK there); a member that is not (a strided view, a state loaded in another layout) takes the list
    // operations instead. So do counts past 2^24: the kernel reads the step count as fp32, exact up to 2^24.
    bool const fused_step = state_[members.front()].step <= (std::int64_t{1} << 24);
    std::vector<std::size_t> fused_members, foreach_members;
    for (std::size_t i : members) {
      at::Tensor const& p = params_[i].param;
      bool const same_layout = p.is_non_overlapping_and_dense() && [&] {
        for (at::Tensor const* t : std::initializer_list<at::Tensor const*>{&p.grad(), &state_[i].exp_avg,
                                                                             &state_[i].exp_avg_sq}) {
          if (!t->is_non_overlapping_and_dense() || t->strides() != p.strides()) return false;
        }
        return true;
      }();
      (fused && fused_step && same_layout ? fused_members : foreach_members).push_back(i);
    }
    if (!fused_members.empty()) fused_update(fused_members, decayed, lr);
    if (!foreach_members.empty()) foreach_update(foreach_members, decayed, lr);
  }
}

AdamW::Lists AdamW::lists(std::vector<std::size_t> const& members) const {
  Lists l;
  for (std::size_t i : members) {
    l.params.push_back(params_[i].param);
    l.grads.push_back(params_[i].param.grad());
    l.exp_avgs.push_back(state_[i].exp_avg);
    l.exp_avg_sqs.push_back(state_[i].exp_avg_sq);
  }
  return l;
}

void AdamW::fused_update(std::vector<std::size_t> const& members, bool decayed, double lr) {
  auto [params, grads, exp_avgs, exp_avg_sqs] = lists(members);
  // The kernel reads each parameter's step count t (after the increment, as torch.optim.AdamW(fused=True) passes
  // it) from a 0-dim fp32 tensor on the parameters' device, for 1 − β^t; it never writes it, so the list's members
  // share one (a fill on the device, no host-to-device copy).
  at::Tensor const step = at::full({}, static_cast<double>(state_[members.front()].step),
                                   at::TensorOptions().dtype(at::kFloat).device(params.front().device()));
  std::vector<at::Tensor> const state_steps(members.size(), step);
  // Decoupled decay p ← p·(1 − lr·wd) inside the kernel: the option's wd on a decayed list, 0 (no decay) otherwise.
  double const weight_decay = decayed ? options_.weight_decay : 0.0;
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, state_steps, lr, options_.beta1,
                    options_.beta2, weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false,
                    /*grad_scale=*/std::nullopt, /*found_inf=*/std::nullopt);
}

void AdamW::foreach_update(std::vector<std::size_t> const& members, bool decayed, double lr) {
  // torch's foreach path: the same element-wise operations in the same order as its single-tensor path, each over a
  // list of tensors (a few kernel launches per list instead of ~8 per parameter).
  double const beta1 = options_.beta1, beta2 = options_.beta2;
  auto [params, grads, exp_avgs, exp_avg_sqs] = lists(members);
  if (decayed && options_.weight_decay != 0) at::_foreach_mul_(params, 1 - lr * options_.weight_decay);
  at::_foreach_lerp_(exp_avgs, grads, 1 - beta1);
  at::_foreach_mul_(exp_avg_sqs, beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2);
  double const t = static_cast<double>(state_[members.front()].step);
  double const bias_correction1 = 1 - std::pow(beta1, t);
  double const bias_correction2 = 1 - std::pow(beta2, t);
  double const step_size = lr / bias_correction1;
  double const bias_correction2_sqrt = std::pow(bias_correction2, 0.5);  // torch: bias_correction2**0.5
  std::vector<at::Tensor> denoms = at::_foreach_sqrt(exp_avg_sqs);
  at::_foreach_div_(denoms, bias_correction2_sqrt);
  at::_foreach_add_(denoms, options_.eps);
  at::_foreach_addcdiv_(params, exp_avgs, denoms, -step_size);
}

std::size_t AdamW::index_of(std::string const& name) const {
  auto const it = index_.find(name);
  TORCH_CHECK(it != index_.end(), "AdamW: no parameter named '", name, "' is registered");
  return it->second;
}

bool AdamW::decays(std::string const& name) const { return decay_[index_of(name)]; }

bool AdamW::has_state(std::string const& name) const { return state_[index_of(name)].step > 0; }

AdamWState const& AdamW::state(std::string const& name) const {
  AdamWState const& s = state_[index_of(name)];
  TORCH_CHECK(s.step > 0, "AdamW: parameter '", name, "' has no state yet (it is created at the first step)");
  return s;
}

void AdamW::load_state(std::string const& name, AdamWState state) {
  std::size_t const i = index_of(name);
  at::Tensor const& p = params_[i].param;
  TORCH_CHECK(state.step >= 1, "AdamW::load_state: '", name, "': step must be >= 1; got ", state.step);
  for (auto const& [field, t] : {std::pair<char const*, at::Tensor const*>{"exp_avg", &state.exp_avg},
                                 std::pair<char const*, at::Tensor const*>{"exp_avg_sq", &state.exp_avg_sq}}) {
    TORCH_CHECK(t->defined(), "AdamW::load_state: '", name, "': ", field, " is undefined");
    TORCH_CHECK(t->sizes() == p.sizes(), "AdamW::load_state: '", name, "': ", field, " has shape ", t->sizes(),
                "; the parameter has ", p.sizes());
    TORCH_CHECK(t->scalar_type() == p.scalar_type(), "AdamW::load_state: '", name, "': ", field, " has dtype ",
                t->scalar_type(), "; the parameter has ", p.scalar_type());
    TORCH_CHECK(t->device() == p.device(), "AdamW::load_state: '", name, "': ", field, " is on ", t->device(),
                "; the parameter is on ", p.device());
  }
  state_[i] = std::move(state);
}

}  // namespace fusepack::optim
