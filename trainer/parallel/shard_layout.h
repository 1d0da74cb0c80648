// How a parameter is split across ranks (PyTorch FSDP2's per-parameter dim-0 sharding): every rank owns a contiguous
// slice of rows of ceil(rows / world_size) rows, the last non-empty slice possibly shorter and later ones empty, and
// each rank's slice is padded with zero rows to that common size for the collectives, so all ranks exchange equal
// counts. Laid end to end in rank order, the padded slices hold the parameter's rows first and only padding after
// them. No torch here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusepack::parallel {

struct ShardLayout {
  std::int64_t rows = 0;        // dim 0 of the parameter (a 1-D parameter's elements)
  std::int64_t row_numel = 1;   // elements per row: the product of the other dims
  std::int64_t chunk_rows = 0;  // rows of every rank's padded slice: ceil(rows / world_size)
  std::int64_t begin = 0;       // this rank's first row
  std::int64_t local_rows = 0;  // this rank's real rows, in [0, chunk_rows]

  // Throws std::invalid_argument for a 0-dim shape, a negative dimension, world_size < 1 or rank outside it.
  static ShardLayout of(std::vector<std::int64_t> const& shape, int rank, int world_size);

  std::int64_t local_numel() const { return local_rows * row_numel; }
  std::int64_t padded_numel() const { return chunk_rows * row_numel; }
  std::int64_t end() const { return begin + local_rows; }
};

// The shape of this rank's shard: `shape` with dim 0 replaced by layout.local_rows.
std::vector<std::int64_t> local_shape(std::vector<std::int64_t> shape, ShardLayout const& layout);

}  // namespace fusepack::parallel
