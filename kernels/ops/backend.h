// Which implementation an op runs: the ATen composite (any device; the baseline users run without fused kernels,
// and the trainer's CPU path) or fusepack's fused CUDA kernels. Chosen explicitly; nothing falls back silently.
#pragma once

#include <string>

namespace fusepack::ops {

enum class Backend { kComposite, kFused };

char const* backend_name(Backend backend);        // "composite", "fused"
Backend parse_backend(std::string const& name);  // throws std::invalid_argument for anything else

// Whether this build carries the fused CUDA kernels (it does whenever nvcc was found at configure time).
bool fused_kernels_built();

}  // namespace fusepack::ops
