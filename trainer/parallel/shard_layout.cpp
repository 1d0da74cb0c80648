#include "trainer/parallel/shard_layout.h"

#include <algorithm>
#include <stdexcept>

namespace fusepack::parallel {

ShardLayout ShardLayout::of(std::vector<std::int64_t> const& shape, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("ShardLayout: rank " + std::to_string(rank) + " is outside a world of " +
                                std::to_string(world_size) + " ranks");
  }
  if (shape.empty()) throw std::invalid_argument("ShardLayout: a 0-dim parameter has no rows to shard");
  ShardLayout l;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) throw std::invalid_argument("ShardLayout: dimension " + std::to_string(d) + " is negative");
    if (d > 0) l.row_numel *= shape[d];
  }
  l.rows = shape[0];
  l.chunk_rows = (l.rows + world_size - 1) / world_size;
  l.begin = std::min(l.rows, rank * l.chunk_rows);
  l.local_rows = std::min(l.rows, l.begin + l.chunk_rows) - l.begin;
  return l;
}

std::vector<std::int64_t> local_shape(std::vector<std::int64_t> shape, ShardLayout const& layout) {
  shape.at(0) = layout.local_rows;
  return shape;
}

}  // namespace fusepack::parallel
