// The per-token step of the fused linear cross-entropy, over a chunk of the head GEMM's logits z [rows, V] (in the
// inputs' dtype), in place, one pass to read and one to write:
//   lse_r  = log Σ_j exp(z_rj)                     fp32, max-shifted (an online max and sum over the row)
//   loss_r = lse_r − z_r[label_r]                  fp32; 0 where label_r = −100
//   z_rj  ← exp(z_rj − lse_r) − [j = label_r]      d loss_r / d z_rj, rounded once to the dtype; 0 on a −100 row
// which is what the composite computes with an fp32 copy of the logits (log-softmax, gather, softmax − one-hot) in
// about a dozen passes over [rows, V] fp32. Each row is one block; the row sum is reduced in a fixed order, so the
// results are bitwise deterministic. A label outside [0, V) other than −100 (the op checks the labels first) makes its
// row's loss and gradient NaN: loud, and never an out-of-bounds access.
#pragma once

#include "kernels/common/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace fusepack {

struct CrossEntropyRowsParams {
  void* logits = nullptr;               // [rows, vocab] contiguous; the gradient replaces the logits when `gradient`
  std::int64_t const* labels = nullptr;  // [rows], each in [0, vocab) or -100
  float* loss = nullptr;                // [rows] out: each row's loss (0 for a -100 row)
  std::int64_t rows = 0;
  std::int64_t vocab = 0;
  bool gradient = true;                 // false: the loss only, the logits untouched
  DType dtype = DType::kBF16;
};

void run_cross_entropy_rows(CrossEntropyRowsParams const& p, cudaStream_t stream);

}  // namespace fusepack
