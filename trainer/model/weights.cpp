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
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList masters,
                                                at::ScalarType dtype) {
    ctx->saved_data["master_dtype"] = masters.front().scalar_type();
    ctx->set_materialize_grads(false);  // a weight the graph did not reach gets no gradient, not a zero-filled one
    std::vector<at::Tensor> out;
    out.reserve(masters.size());
    for (at::Tensor const& m : masters) out.push_back(at::empty_like(m, m.options().dtype(dtype)));
    at::_foreach_copy_(out, masters);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::ScalarType const master_dtype = ctx->saved_data["master_dtype"].toScalarType();
    std::vector<at::Tensor> src, dst;
    torch::autograd::variable_list out(grads.size() + 1);  // one per master, then none for `dtype`
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

}  // namespace

std::vector<at::Tensor> cast_tensors(at::TensorList masters, at::ScalarType dtype) {
  if (masters.empty()) return {};
  for (at::Tensor const& m : masters) {
    TORCH_CHECK(m.scalar_type() == masters.front().scalar_type() && m.device() == masters.front().device(),
                "cast_tensors: the masters must share one dtype and device; got ", m.scalar_type(), " on ",
                m.device(), " beside ", masters.front().scalar_type(), " on ", masters.front().device());
  }
  return CastTensorsFunction::apply(masters, dtype);
}

LocalWeights::LocalWeights(Qwen35Config const& config, NamedParameters const& params, MixedPrecisionPolicy policy)
    : config_(config) {
  std::unordered_map<std::string, at::Tensor> by_name;
  for (auto const& [name, p] : params) by_name.emplace(name, p);
  for (ParameterSpec const& spec : parameter_specs(config)) {
    if (by_name.count(spec.name) == 0) throw std::invalid_argument("LocalWeights: no parameter '" + spec.name + "'");
  }
  if (!params.empty()) device_ = params.front().second.device();
  for (WeightGroup const& group : weight_groups(config)) {
    std::vector<Member>& members = groups_.emplace_back();
    for (std::string const& name : group_parameter_names(config, group)) {
      at::Tensor const& p = by_name.at(name);
      members.push_back({name, p, policy.compute_dtype(name, p.scalar_type())});
    }
  }
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
    std::vector<at::Tensor> masters;
    for (Member const* m : members) masters.push_back(m->master);
    std::vector<at::Tensor> const cast = cast_tensors(masters, dtypes.second);
    for (std::size_t i = 0; i < members.size(); ++i) out.emplace(members[i]->name, cast[i]);
  }
  return out;
}

}  // namespace fusepack::model
