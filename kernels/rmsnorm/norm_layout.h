// How the rows of the norm kernels (rmsnorm, gated_rmsnorm) map onto CUDA threads: plain C++, no CUDA headers, so
// the CPU tests can check every row length.
#pragma once

#include "kernels/common/static_switch.h"

#include <cstdint>

namespace fusepack {

// A row is kept in registers between the reduction and the output: D is bounded (Qwen3.5's largest norm is 5120).
inline constexpr std::int64_t kNormMaxDim = 8192;

// The values of NormRowLayout::iters: the launchers instantiate their kernels over this list (norm_kernel_for,
// norm_rows.cuh), so norm_row_layout must produce no other.
using NormIters = IntList<1, 2, 4, 8>;

// How rows of D elements map onto threads.
//   small rows (<= 128 accesses): a group of `lanes` consecutive lanes of a warp per row, 256 / lanes rows per block;
//   large rows: one row per block of `threads` threads (a multiple of 32).
// Each thread keeps `iters` accesses of `elems` elements of a row in registers.
struct NormRowLayout {
  bool supported = false;      // false when dim is outside 1..kNormMaxDim
  bool vec = false;            // 16-byte accesses; else one element per access
  int elems = 1;               // elements per access: 16 / sizeof(T) on the vector path, 1 on the scalar path
  std::int64_t chunks = 0;     // accesses per row: dim / elems
  bool block_per_row = false;  // one row per block (else `lanes` threads of a warp per row)
  int lanes = 0;               // threads per row (= threads when block_per_row)
  int iters = 0;               // accesses per thread and row: one of NormIters
  int threads = 0;             // per block
  int rows_per_block() const { return block_per_row ? 1 : threads / lanes; }
};

// `vec_ok`: every pointer of the pass is 16-byte aligned (the vector path also needs dim % (16 / elem_bytes) == 0).
// `small_row_iters` (1, 2 or 4): accesses per thread wanted for small rows. The forward asks for 4 (four 16-byte loads
// in flight per thread, 8 lanes per row at D = 256 bf16); the backward asks for 1 (32 lanes: fewer fp32 dweight
// accumulators per thread; its loads are kept in flight by the cp.async ring instead).
inline NormRowLayout norm_row_layout(std::int64_t dim, int elem_bytes, bool vec_ok, int small_row_iters) {
  NormRowLayout l;
  if (dim < 1 || dim > kNormMaxDim) return l;
  int const vec_elems = 16 / elem_bytes;
  l.vec = vec_ok && dim % vec_elems == 0;
  l.elems = l.vec ? vec_elems : 1;
  l.chunks = dim / l.elems;
  auto const ceil_div = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  if (l.chunks <= 128) {
    l.lanes = 4;
    while (l.lanes < 32 && std::int64_t(l.lanes) * small_row_iters < l.chunks) l.lanes *= 2;
    l.iters = 1;
    while (std::int64_t(l.iters) * l.lanes < l.chunks) l.iters *= 2;  // 1, 2 or 4
    l.threads = 256;
    l.supported = true;
    return l;
  }
  // One row per block. First choice: <= 256 threads with up to 32 elements each (several 16-byte loads in flight per
  // thread, as Apex/FlashAttention's layer norms do); else (long scalar rows) up to 1024 threads with <= 8 each.
  l.block_per_row = true;
  for (int pass = 0; pass < 2 && !l.supported; ++pass) {
    for (int iters = 1; iters <= 8 && !l.supported; iters *= 2) {
      std::int64_t const threads = ceil_div(ceil_div(l.chunks, iters), 32) * 32;
      bool const fits = pass == 0 ? threads <= 256 && iters * l.elems <= 32 : threads <= 1024 && iters * l.elems <= 8;
      if (fits) {
        l.iters = iters;
        l.threads = static_cast<int>(threads);
        l.lanes = l.threads;
        l.supported = true;
      }
    }
  }
  return l;
}

}  // namespace fusepack
