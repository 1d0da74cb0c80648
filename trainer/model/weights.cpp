#include "trainer/model/weights.h"

#include "trainer/model/parameters.h"

#include <ATen/ATen.h>

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

LocalWeights::LocalWeights(Qwen35Config const& config, NamedParameters const& params, MixedPrecisionPolicy policy)
    : config_(config), policy_(policy) {
  for (auto const& [name, p] : params) params_.emplace(name, p);
  for (ParameterSpec const& spec : parameter_specs(config)) {
    if (params_.count(spec.name) == 0) throw std::invalid_argument("LocalWeights: no parameter '" + spec.name + "'");
  }
  if (!params.empty()) device_ = params.front().second.device();
}

GroupWeights LocalWeights::acquire(WeightGroup const& group, bool /*recomputing*/) {
  GroupWeights out;
  for (std::string const& name : group_parameter_names(config_, group)) {
    at::Tensor const& p = params_.at(name);
    out.emplace(name, p.to(policy_.compute_dtype(name, p.scalar_type())));  // identity when the dtypes agree
  }
  return out;
}

}  // namespace fusepack::model
