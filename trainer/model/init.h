// Parameter initialisation a sharded trainer can run per rank: any dim-0 row slice of any parameter, generated where
// its tensor lives (CPU or CUDA), with values that depend only on (seed, parameter name, element index) — not on the
// number of ranks, the split, the device, or which other parameters were initialised before it. The generator and
// its numerical contract are in init_element.h.
#pragma once

#include "trainer/model/parameters.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fusepack::model {

// Fills `out` with rows [row_begin, row_begin + out.size(0)) along dim 0 of parameter `spec`'s initial value for
// `seed` (a 1-D parameter's rows are its elements). Element j of the full parameter (row-major flat index) is a pure
// function of (seed, spec.name, j, spec.init, initializer_range): independent of the device, of how the rows are
// split, and of any other parameter; the CPU and CUDA paths agree bit for bit.
// `out`: contiguous, [rows, spec.shape[1:]...], fp64/fp32/bf16/fp16, on the CPU (at::get_num_threads() threads,
// 100–200 ns an element each) or on a CUDA device (generated there, on that device's current stream; nothing is
// generated on the host). An empty slice may start at spec.shape[0], as the last ranks of an uneven split do.
// Throws std::invalid_argument naming the parameter for a wrong shape, a row range outside the parameter, an
// unsupported dtype or device (a CUDA tensor in a build without CUDA kernels: the message names the build option),
// or a kNormal rule with an initializer_range that is not finite and positive.
void init_parameter_rows(ParameterSpec const& spec, double initializer_range, std::uint64_t seed,
                         std::int64_t row_begin, at::Tensor& out);

}  // namespace fusepack::model
