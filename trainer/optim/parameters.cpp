#include "trainer/optim/parameters.h"

#include <c10/util/Exception.h>

#include <unordered_map>

namespace fusepack::optim {

void check_parameters(char const* who, std::vector<NamedParameter> const& params) {
  std::unordered_map<std::string, std::size_t> seen_names;
  std::unordered_map<c10::TensorImpl const*, std::size_t> seen_tensors;
  for (std::size_t i = 0; i < params.size(); ++i) {
    NamedParameter const& p = params[i];
    TORCH_CHECK(!p.name.empty(), who, ": parameter ", i, " has an empty name");
    TORCH_CHECK(p.param.defined(), who, ": parameter '", p.name, "' is an undefined tensor");
    TORCH_CHECK(p.param.layout() == at::kStrided, who, ": parameter '", p.name, "' has layout ", p.param.layout(),
                "; only dense (strided) parameters are supported");
    auto const s = p.param.scalar_type();
    TORCH_CHECK(s == at::kFloat || s == at::kDouble, who, ": parameter '", p.name, "' has dtype ", s,
                "; the optimizer works on fp32 master weights (fp64 in tests): keep low-precision compute copies "
                "outside it");
    auto const [name_it, new_name] = seen_names.emplace(p.name, i);
    TORCH_CHECK(new_name, who, ": parameter name '", p.name, "' is registered twice (entries ", name_it->second,
                " and ", i, ")");
    auto const [tensor_it, new_tensor] = seen_tensors.emplace(p.param.unsafeGetTensorImpl(), i);
    TORCH_CHECK(new_tensor, who, ": '", params[tensor_it->second].name, "' and '", p.name,
                "' are the same tensor; a tied weight must be registered once (it would be updated twice)");
  }
}

}  // namespace fusepack::optim
