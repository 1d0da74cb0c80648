// Argument validation shared by the reference ops. Every failure throws std::invalid_argument whose message names
// the op, the argument and the dimension, with what was expected and what was given.
#pragma once

#include "reference/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::ref {

[[noreturn]] void fail(std::string const& op, std::string const& message);

// `name` must be defined with exactly `expected` as shape; -1 in `expected` accepts any size in that dimension.
void check_shape(std::string const& op, std::string const& name, Tensor const& t, Shape const& expected);
// `name` must be defined with `rank` dimensions.
void check_rank(std::string const& op, std::string const& name, Tensor const& t, Index rank);
// cu_seqlens of a packed batch of T tokens: at least two entries, cu[0] == 0, non-decreasing, cu[N] == T.
void check_cu_seqlens(std::string const& op, std::vector<std::int32_t> const& cu_seqlens, Index T);
void check_positive(std::string const& op, std::string const& name, double value);

}  // namespace fusepack::ref
