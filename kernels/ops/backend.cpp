#include "kernels/ops/backend.h"

#include <stdexcept>

namespace fusepack::ops {

char const* backend_name(Backend backend) { return backend == Backend::kFused ? "fused" : "composite"; }

Backend parse_backend(std::string const& name) {
  if (name == "composite") return Backend::kComposite;
  if (name == "fused") return Backend::kFused;
  throw std::invalid_argument("unknown backend '" + name + "' (expected 'composite' or 'fused')");
}

bool fused_kernels_built() {
#ifdef FUSEPACK_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

}  // namespace fusepack::ops
