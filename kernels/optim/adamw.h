// AdamW over many tensors in a few launches: the trainer's optimizer step on CUDA. Per element, in the master dtype
// (fp32 or fp64), with every constant computed in fp64 on the host and rounded once:
//   g ← g·grad_scale                                   (clipping's factor; one rounded product, never fused)
//   p ← p·(1 − lr·wd)                                  (decoupled decay)
//   m ← m + (1 − β1)·(g − m)                           (torch's lerp)
//   v ← β2·v + (1 − β2)·g·g
//   p ← p − (lr / (1 − β1^t))·m / (√v / √(1 − β2^t) + eps)
//   copy ← p in the copy's dtype                        (optional: the forward's compute copy, written as p is)
// One pass: p, g, m, v read once; p, m, v (and the copy) written once; g is read, never written. Every element is
// independent of every other, so the result does not depend on the launch shape and is bitwise deterministic.
#pragma once

#include "kernels/common/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace fusepack {

// One parameter's flat storage: p, g, m, v (and the copy, when there is one) are `numel` elements laid out in the
// same order (the caller checks: one dense layout shared by all).
struct AdamWTensor {
  void* param = nullptr;         // p, master dtype
  void const* grad = nullptr;    // g, master dtype
  void* exp_avg = nullptr;       // m, master dtype
  void* exp_avg_sq = nullptr;    // v, master dtype
  void* copy = nullptr;          // null, or p after the update in `copy_dtype`
  std::int64_t numel = 0;
};

struct AdamWUpdateParams {
  std::vector<AdamWTensor> tensors;
  bool fp64 = false;               // the master dtype: fp64, else fp32
  DType copy_dtype = DType::kBF16;  // of every non-null copy
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  double grad_scale = 1;  // g is read as g·grad_scale
  std::int64_t step = 1;  // t, after the increment (>= 1)
};

// Copies from fp64 masters round through fp32, as ATen's copy to bf16 and fp16 does (the copy equals
// `p.to(copy_dtype)` to the bit in every combination).
void run_adamw_update(AdamWUpdateParams const& p, cudaStream_t stream);

}  // namespace fusepack
