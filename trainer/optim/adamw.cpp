#include "trainer/optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#if defined(FUSEPACK_WITH_CUDA_KERNELS)
#include "kernels/optim/adamw.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

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
  copies_.resize(params_.size());
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

namespace {

#if defined(FUSEPACK_WITH_CUDA_KERNELS)
constexpr bool kHaveFusepackKernel = true;
#else
constexpr bool kHaveFusepackKernel = false;
#endif

enum class Path { kFusepack, kAtenFused, kForeach };

// The implementation a list on `device` takes (before the per-member layout rule).
Path path_for(AdamWKernel kernel, at::Device device, std::string const& first_name) {
  switch (kernel) {
    case AdamWKernel::kAuto:
      if (!device.is_cuda()) return Path::kForeach;
      return kHaveFusepackKernel ? Path::kFusepack : Path::kAtenFused;
    case AdamWKernel::kFusepack:
      TORCH_CHECK(kHaveFusepackKernel, "AdamW: fusepack's AdamW kernel was requested, but this build has no CUDA "
                  "kernels (configure with nvcc found)");
      TORCH_CHECK(device.is_cuda(), "AdamW: fusepack's AdamW kernel runs on CUDA only; '", first_name, "' is on ",
                  device);
      return Path::kFusepack;
    case AdamWKernel::kFused: return Path::kAtenFused;
    case AdamWKernel::kForeach: return Path::kForeach;
  }
  return Path::kForeach;
}

}  // namespace

void AdamW::step(double lr, double grad_scale) {
  TORCH_CHECK(std::isfinite(lr) && lr >= 0, "AdamW::step: lr must be finite and >= 0; got ", lr);
  TORCH_CHECK(std::isfinite(grad_scale) && grad_scale > 0, "AdamW::step: grad_scale must be finite and > 0; got ",
              grad_scale);
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
  for (std::vector<std::size_t> const& group : groups_) {  // a kernel that cannot run fails here, too
    path_for(options_.kernel, params_[group.front()].param.device(), params_[group.front()].name);
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
    Path const path = path_for(options_.kernel, device, params_[members.front()].name);
    // The one-pass kernels take only members whose p, g, m and v are dense with one layout (they treat the four as
    // flat arrays; for ATen's a TORCH_CHECK there); a member that is not (a strided view, a state loaded in another
    // layout) takes the list operations instead. So do counts past 2^24 on ATen's fused kernel: it reads the step
    // count as fp32, exact up to 2^24.
    bool const one_pass = path == Path::kFusepack ||
                          (path == Path::kAtenFused && state_[members.front()].step <= (std::int64_t{1} << 24));
    std::vector<std::size_t> one_pass_members, foreach_members;
    for (std::size_t i : members) {
      at::Tensor const& p = params_[i].param;
      bool const same_layout = p.is_non_overlapping_and_dense() && [&] {
        for (at::Tensor const* t : std::initializer_list<at::Tensor const*>{&p.grad(), &state_[i].exp_avg,
                                                                             &state_[i].exp_avg_sq}) {
          if (!t->is_non_overlapping_and_dense() || t->strides() != p.strides()) return false;
        }
        return true;
      }();
      (one_pass && same_layout ? one_pass_members : foreach_members).push_back(i);
    }
    if (path == Path::kFusepack && !one_pass_members.empty()) {
      fusepack_update(one_pass_members, decayed, lr, grad_scale);
      one_pass_members.clear();
    }
    // The list paths see clipped gradients, scaled in place as clipping always did (bit for bit).
    if (grad_scale != 1.0 && !(one_pass_members.empty() && foreach_members.empty())) {
      std::vector<at::Tensor> grads;
      for (auto const* list : {&one_pass_members, &foreach_members}) {
        for (std::size_t i : *list) grads.push_back(params_[i].param.grad());
      }
      at::_foreach_mul_(grads, grad_scale);
    }
    if (!one_pass_members.empty()) fused_update(one_pass_members, decayed, lr);
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

void AdamW::fusepack_update(std::vector<std::size_t> const& members, bool decayed, double lr, double grad_scale) {
#if defined(FUSEPACK_WITH_CUDA_KERNELS)
  at::Tensor const& first = params_[members.front()].param;
  AdamWUpdateParams u;
  u.fp64 = first.scalar_type() == at::kDouble;
  u.lr = lr;
  u.beta1 = options_.beta1;
  u.beta2 = options_.beta2;
  u.eps = options_.eps;
  u.weight_decay = decayed ? options_.weight_decay : 0.0;
  u.grad_scale = grad_scale;
  u.step = state_[members.front()].step;
  // The kernel writes copies of one dtype per launch: one list per copy dtype, members without a copy in the first.
  std::map<DType, std::vector<AdamWTensor>> by_copy_dtype;
  std::vector<std::size_t> written;  // members whose copy is written
  std::vector<AdamWTensor> plain;
  for (std::size_t i : members) {
    at::Tensor const& p = params_[i].param;
    AdamWState const& s = state_[i];
    AdamWTensor t{p.data_ptr(), p.grad().data_ptr(), s.exp_avg.data_ptr(), s.exp_avg_sq.data_ptr(), nullptr,
                  p.numel()};
    std::optional<DType> copy_dtype;
    if (ComputeCopy const* c = copies_[i].get(); c != nullptr && c->value.defined()) {
      at::Tensor const& v = c->value;
      copy_dtype = v.scalar_type() == at::kBFloat16 ? std::optional<DType>(DType::kBF16)
                   : v.scalar_type() == at::kHalf   ? std::optional<DType>(DType::kF16)
                   : v.scalar_type() == at::kFloat  ? std::optional<DType>(DType::kF32)
                                                    : std::nullopt;
      // A copy the kernel cannot write as flat elements of p's layout is left stale (cast again when next used).
      if (v.device() != p.device() || v.sizes() != p.sizes() || v.strides() != p.strides()) copy_dtype.reset();
    }
    if (copy_dtype) {
      t.copy = copies_[i]->value.data_ptr();
      by_copy_dtype[*copy_dtype].push_back(t);
      written.push_back(i);
    } else {
      plain.push_back(t);
    }
  }
  if (by_copy_dtype.empty()) by_copy_dtype[DType::kBF16] = {};
  auto& first_list = by_copy_dtype.begin()->second;
  first_list.insert(first_list.end(), plain.begin(), plain.end());
  c10::cuda::CUDAGuard const guard(first.device());
  // An op-level profiler range: the profile attributes a kernel through the CPU op that launched it (the enclosing
  // "optimizer" range is a user scope, which links no kernel).
  at::RecordFunction range(at::RecordScope::FUNCTION);
  if (range.isActive()) at::detail::record_function_with_scope(range, "fusepack_adamw", std::vector<c10::IValue>());
  for (auto& [copy_dtype, tensors] : by_copy_dtype) {
    u.copy_dtype = copy_dtype;
    u.tensors = std::move(tensors);
    run_adamw_update(u, c10::cuda::getCurrentCUDAStream(first.device().index()));
  }
  // Written through raw pointers: bump the version counters as an in-place ATen operation would, so whatever
  // checks them (autograd's saved tensors, the compute copies' validity) sees the change.
  bump_versions(members);
  for (std::size_t i : written) {
    ComputeCopy& c = *copies_[i];
    c.value.unsafeGetTensorImpl()->bump_version();
    c.master_version = static_cast<std::int64_t>(params_[i].param._version());
  }
#else
  (void)members;
  (void)decayed;
  (void)lr;
  (void)grad_scale;
  TORCH_CHECK(false, "AdamW: fusepack's AdamW kernel is not in this build");
#endif
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
  // ATen's fused kernel does not bump the version counters of what it writes (torch 2.11, checked by
  // AdamW.ListPathsLeaveComputeCopiesStale): bump them as any in-place operation does.
  bump_versions(members);
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

void AdamW::bump_versions(std::vector<std::size_t> const& members) {
  for (std::size_t i : members) {
    for (at::Tensor const* t : {&params_[i].param, &state_[i].exp_avg, &state_[i].exp_avg_sq}) {
      t->unsafeGetTensorImpl()->bump_version();
    }
  }
}

void AdamW::set_compute_copies(ComputeCopies const& copies) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto const it = copies.find(params_[i].name);
    copies_[i] = it == copies.end() ? nullptr : it->second;
  }
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
