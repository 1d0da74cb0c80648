#include "trainer/model/weights.h"

#include "trainer/model/parameters.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <stdexcept>

namespace fusepack::model {

std::string WeightGroup::str() const {
  switch (kind) {
    case Kind::kEmbedding: return "embedding";
    case Kind::kLayer: return "layer " + std::to_string(layer);
    case Kind::kHead: return "head";
  }
  return "?";
}

std::vector<WeightGroup> weight_groups(Qwen35Config const& config) {
  std::vector<WeightGroup> groups{WeightGroup::embedding()};
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) groups.push_back(WeightGroup::decoder_layer(i));
  groups.push_back(WeightGroup::head());
  return groups;
}

std::vector<std::string> group_parameter_names(Qwen35Config const& config, WeightGroup const& group) {
  std::vector<std::string> names;
  switch (group.kind) {
    case WeightGroup::Kind::kEmbedding: names.push_back("model.embed_tokens.weight"); break;
    case WeightGroup::Kind::kHead:
      names.push_back("model.norm.weight");
      names.push_back(config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
      break;
    case WeightGroup::Kind::kLayer: {
      if (group.layer < 0 || group.layer >= config.num_hidden_layers) {
        throw std::invalid_argument("weight group " + group.str() + ": the model has " +
                                    std::to_string(config.num_hidden_layers) + " layers");
      }
      std::string const prefix = "model.layers." + std::to_string(group.layer) + ".";
      for (ParameterSpec const& spec : parameter_specs(config)) {
        if (spec.name.compare(0, prefix.size(), prefix) == 0) names.push_back(spec.name);
      }
      break;
    }
  }
  return names;
}

bool MixedPrecisionPolicy::keeps_master_dtype(std::string const& name) {
  auto ends_with = [&](char const* suffix) {
    std::string const s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".A_log") || ends_with(".dt_bias");
}

at::ScalarType MixedPrecisionPolicy::compute_dtype(std::string const& name, at::ScalarType master) const {
  return keeps_master_dtype(name) ? master : param_dtype.value_or(master);
}

namespace {

struct CastTensorsFunction : torch::autograd::Function<CastTensorsFunction> {
  // `copies`: null, or the casts already made (compute copies), handed out instead of casting again.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList masters,
                                                at::ScalarType dtype, std::vector<at::Tensor> const* copies) {
    ctx->saved_data["master_dtype"] = masters.front().scalar_type();
    ctx->set_materialize_grads(false);  // a weight the graph did not reach gets no gradient, not a zero-filled one
    std::vector<at::Tensor> out;
    out.reserve(masters.size());
    if (copies != nullptr) {
      // New tensors over the copies' storage (own autograd metadata and version counter), not views of them.
      for (at::Tensor const& c : *copies) out.push_back(c.variable_data());
      return out;
    }
    for (at::Tensor const& m : masters) out.push_back(at::empty_like(m, m.options().dtype(dtype)));
    at::_foreach_copy_(out, masters);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::ScalarType const master_dtype = ctx->saved_data["master_dtype"].toScalarType();
    std::vector<at::Tensor> src, dst;
    torch::autograd::variable_list out(grads.size() + 2);  // one per master, then none for `dtype` and `copies`
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      out[i] = at::empty_like(grads[i], grads[i].options().dtype(master_dtype));
      src.push_back(grads[i]);
      dst.push_back(out[i]);
    }
    if (!src.empty()) at::_foreach_copy_(dst, src);
    return out;
  }
};

void check_masters(char const* who, at::TensorList masters) {
  for (at::Tensor const& m : masters) {
    TORCH_CHECK(m.scalar_type() == masters.front().scalar_type() && m.device() == masters.front().device(), who,
                ": the masters must share one dtype and device; got ", m.scalar_type(), " on ", m.device(),
                " beside ", masters.front().scalar_type(), " on ", masters.front().device());
  }
}

}  // namespace

std::vector<at::Tensor> cast_tensors(at::TensorList masters, at::ScalarType dtype) {
  if (masters.empty()) return {};
  check_masters("cast_tensors", masters);
  return CastTensorsFunction::apply(masters, dtype, nullptr);
}

std::vector<at::Tensor> cast_tensors_from_copies(at::TensorList masters, std::vector<at::Tensor> const& copies) {
  if (masters.empty()) return {};
  check_masters("cast_tensors_from_copies", masters);
  TORCH_CHECK(copies.size() == masters.size(), "cast_tensors_from_copies: ", copies.size(), " copies for ",
              masters.size(), " masters");
  for (std::size_t i = 0; i < copies.size(); ++i) {
    TORCH_CHECK(copies[i].defined() && copies[i].sizes() == masters[i].sizes() &&
                    copies[i].device() == masters[i].device() &&
                    copies[i].scalar_type() == copies.front().scalar_type(),
                "cast_tensors_from_copies: copy ", i, " does not match its master (shape ", masters[i].sizes(),
                " on ", masters[i].device(), ") or the first copy's dtype");
  }
  return CastTensorsFunction::apply(masters, copies.front().scalar_type(), &copies);
}

LocalWeights::LocalWeights(Qwen35Config const& config, NamedParameters const& params, MixedPrecisionPolicy policy)
    : config_(config) {
  std::unordered_map<std::string, at::Tensor> by_name;
  for (auto const& [name, p] : params) by_name.emplace(name, p);
  for (ParameterSpec const& spec : parameter_specs(config)) {
    if (by_name.count(spec.name) == 0) throw std::invalid_argument("LocalWeights: no parameter '" + spec.name + "'");
  }
  if (!params.empty()) device_ = params.front().second.device();
  std::unordered_map<std::string, std::shared_ptr<optim::ComputeCopy>> copies;  // one per name: a tied weight's two
  for (WeightGroup const& group : weight_groups(config)) {
    std::vector<Member>& members = groups_.emplace_back();
    for (std::string const& name : group_parameter_names(config, group)) {
      at::Tensor const& p = by_name.at(name);
      at::ScalarType const compute = policy.compute_dtype(name, p.scalar_type());
      std::shared_ptr<optim::ComputeCopy> copy;
      if (compute != p.scalar_type()) {
        std::shared_ptr<optim::ComputeCopy>& shared = copies[name];
        if (!shared) shared = std::make_shared<optim::ComputeCopy>();
        copy = shared;
      }
      members.push_back({name, p, compute, std::move(copy)});
    }
  }
}

optim::ComputeCopies LocalWeights::compute_copies() const {
  optim::ComputeCopies out;
  for (std::vector<Member> const& group : groups_) {
    for (Member const& m : group) {
      if (m.copy) out.emplace(m.name, m.copy);
    }
  }
  return out;
}

GroupWeights LocalWeights::acquire(WeightGroup const& group, bool /*recomputing*/) {
  std::size_t const index = group.kind == WeightGroup::Kind::kEmbedding ? 0
                            : group.kind == WeightGroup::Kind::kHead    ? groups_.size() - 1
                                                                        : static_cast<std::size_t>(group.layer) + 1;
  if (group.kind == WeightGroup::Kind::kLayer && (group.layer < 0 || index + 1 >= groups_.size())) {
    group_parameter_names(config_, group);  // throws, naming the group and the layer count
  }
  GroupWeights out;
  // Masters already in their compute dtype are handed out as they are; the rest, by (master, compute) dtype pair,
  // go through one cast each.
  std::map<std::pair<at::ScalarType, at::ScalarType>, std::vector<Member const*>> casts;
  for (Member const& m : groups_[index]) {
    if (m.compute_dtype == m.master.scalar_type()) {
      out.emplace(m.name, m.master);
    } else {
      casts[{m.master.scalar_type(), m.compute_dtype}].push_back(&m);
    }
  }
  for (auto const& [dtypes, members] : casts) {
    std::vector<at::Tensor> masters, copies, stale_masters, stale_copies;
    for (Member const* m : members) {
      masters.push_back(m->master);
      optim::ComputeCopy& c = *m->copy;
      if (!c.valid_for(m->master)) {
        if (!c.value.defined()) c.value = at::empty_like(m->master, m->master.options().dtype(dtypes.second));
        stale_masters.push_back(m->master);
        stale_copies.push_back(c.value);
      }
      copies.push_back(c.value);
    }
    if (!stale_masters.empty()) {
      at::NoGradGuard no_grad;
      at::_foreach_copy_(stale_copies, stale_masters);
      for (Member const* m : members) m->copy->master_version = static_cast<std::int64_t>(m->master._version());
    }
    std::vector<at::Tensor> const cast = cast_tensors_from_copies(masters, copies);
    for (std::size_t i = 0; i < members.size(); ++i) out.emplace(members[i]->name, cast[i]);
  }
  return out;
}

}  // namespace fusepack::model
