// The LM head and its token cross-entropy as one op:
//   loss_sum = Σ_{t: labels[t] != -100} (logsumexp(z_t) − z_t[labels[t]]),   z = hidden · weightᵀ  ([T, vocab])
// The logits are computed in the inputs' dtype and the loss in fp32 (fp64 for fp64 inputs), as Hugging Face does.
//   composite: z for every token at once, then ATen's cross-entropy, autograd through both: [T, vocab] logits and
//              their fp32 copy live until the backward (8 GB at T = 8192 with Qwen3.5's 248,320-token vocabulary).
//   fused:     chunks of tokens through the head GEMM; per chunk one kernel turns the logits into the chunk's loss
//              and, in the same memory, their gradient (kernels/linear_cross_entropy/cross_entropy_rows.h), then
//              d hidden = g · W and d weight += gᵀ · h (accumulated in fp32 across chunks); the backward scales the
//              stored gradients by the incoming one. At most one chunk's logits (about 1 GiB in the inputs' dtype)
//              exist at a time. Runs on CUDA only (nothing falls back to the composite).
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fusepack::ops {

inline constexpr std::int64_t kLinearCrossEntropyIgnoreIndex = -100;

// hidden: [T, H]; weight: [V, H] (same dtype and device); labels: [T] int64, each in [0, V) or -100. Returns the 0-dim
// loss sum (fp32, or fp64 for fp64 inputs), differentiable in hidden and weight. chunk_tokens: tokens per chunk of the
// fused path (0: linear_cross_entropy_chunk); ignored by the composite. labels_checked: the caller has checked every
// label (a ModelBatch's are, on the host, when it is made), so the op skips its own check, which costs a
// device-to-host sync; the fused kernel still turns a bad label into a NaN loss, never an out-of-bounds read.
at::Tensor linear_cross_entropy(at::Tensor const& hidden, at::Tensor const& weight, at::Tensor const& labels,
                                Backend backend, std::int64_t chunk_tokens = 0, bool labels_checked = false);

// The fused path's chunked algorithm on any device with its per-token step as ATen operations (the fused op runs that
// step as one CUDA kernel), for tests of the chunking, the fp32 accumulation across chunks and the backward's scaling
// on the CPU (fp64, fp32). Inputs as above; records no op run.
at::Tensor chunked_linear_cross_entropy(at::Tensor const& hidden, at::Tensor const& weight, at::Tensor const& labels,
                                        std::int64_t chunk_tokens = 0);

// Tokens per chunk for `vocab` (>= 1), T tokens and logits of `element_bytes` each: 1 GiB of logits (2,162 tokens of
// Qwen3.5's 248,320-token vocabulary in bf16), at least 1, at most T.
std::int64_t linear_cross_entropy_chunk(std::int64_t vocab, std::int64_t tokens, std::int64_t element_bytes);

}  // namespace fusepack::ops
