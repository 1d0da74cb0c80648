// Causal softmax attention over packed examples (block-diagonal: a token sees only earlier tokens of its own
// example), GQA, and Qwen3.5's optional output gate, on either backend, with autograd.
#pragma once

#include "kernels/ops/backend.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fusepack::ops {

// q: [T, Hq, D]; k, v: [T, Hkv, D] with Hq a multiple of Hkv (query head h reads key/value head h / (Hq/Hkv));
// cu_seqlens: int32 [N+1], 0 = cu[0] <= cu[1] <= ... <= cu[N] = T (empty examples allowed); max_seqlen: at least
// the longest example (checked); scale > 0 (Qwen3.5: D^−1/2); gate: [T, Hq, D] or undefined. Returns
// o · σ(gate) (or o without a gate): [T, Hq, D] in q's dtype.
// Composite: per example, plain ATen math as HF's eager attention computes it (scores in the input dtype, causal
// mask, softmax in fp32, cast back, · v), then · σ(gate). Any device and floating dtype.
// Fused: FlashAttention-2 varlen (inside LibTorch) + fusepack's gate kernels. CUDA, contiguous, bf16 or fp16 only
// (FlashAttention-2 has no fp32 path), D a multiple of 8 up to 256, cu_seqlens on q's device. The backward's dq is
// bitwise deterministic only when at::globalContext().deterministicAlgorithms() is on (kernels/attention/NOTES.md).
at::Tensor attention(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v, at::Tensor const& cu_seqlens,
                     int64_t max_seqlen, double scale, at::Tensor const& gate, Backend backend);

}  // namespace fusepack::ops
