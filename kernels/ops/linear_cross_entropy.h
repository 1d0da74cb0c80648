// The LM head and its token cross-entropy as one op:
//   loss_sum = Σ_{t: labels[t] != -100} (logsumexp(z_t) − z_t[labels[t]]),   z = hidden · weightᵀ  ([T, vocab])
// The logits are computed in the inputs' dtype and the loss in fp32 (fp64 for fp64 inputs), as Hugging Face does.
//   composite: z for every token at once, then ATen's cross-entropy, autograd through both: [T, vocab] logits and
//              their fp32 copy live until the backward (8 GB at T = 8192 with Qwen3.5's 248,320-token vocabulary).
//   fused:     chunks of tokens through the head GEMM; per chunk the logits, the loss and both gradients
//              (d hidden, and d weight accumulated in fp32 across chunks) in the forward, then the chunk's logits are
//              dropped; the backward scales the stored gradients by the incoming one. At most one chunk's logits
//              (about 256 MiB in fp32) exist at a time. Runs on CUDA only (nothing falls back to the composite).
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fusepack::ops {

inline constexpr std::int64_t kLinearCrossEntropyIgnoreIndex = -100;

// hidden: [T, H]; weight: [V, H] (same dtype and device); labels: [T] int64, each in [0, V) or -100. Returns the 0-dim
// loss sum (fp32, or fp64 for fp64 inputs), differentiable in hidden and weight. chunk_tokens: tokens per chunk of the
// fused path (0: as many as keep one chunk's fp32 logits near 256 MiB); ignored by the composite.
at::Tensor linear_cross_entropy(at::Tensor const& hidden, at::Tensor const& weight, at::Tensor const& labels,
                                Backend backend, std::int64_t chunk_tokens = 0);

// The fused path's chunked algorithm on any device, for tests of the algorithm on the CPU (fp64, fp32); the fused
// backend runs exactly this on CUDA. Inputs as above; records no op run.
at::Tensor chunked_linear_cross_entropy(at::Tensor const& hidden, at::Tensor const& weight, at::Tensor const& labels,
                                        std::int64_t chunk_tokens = 0);

// The fused path's tokens per chunk for `vocab` (>= 1) and T tokens: 2^28 bytes of fp32 logits, at least 1, at most T.
std::int64_t linear_cross_entropy_chunk(std::int64_t vocab, std::int64_t tokens);

}  // namespace fusepack::ops
