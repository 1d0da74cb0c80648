// The output gate of Qwen3.5's gated attention, y = o · σ(gate), around FlashAttention-2 (which
// kernels/ops/attention.cpp calls through ATen): the forward reads o and gate once; the backward gives both gradients
// in one pass. Numerical contract: inputs widened to fp32, sigmoid and products in fp32, one rounding per output.
#pragma once

#include "kernels/common/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace fusepack {

struct AttentionGateFwdParams {
  void const* o = nullptr;     // [n] = [T, Hq, D] contiguous: FlashAttention's output
  void const* gate = nullptr;  // [n] = [T, Hq, D] contiguous
  void* y = nullptr;           // [n] = [T, Hq, D] contiguous: o · σ(gate)
  std::int64_t n = 0;
  DType dtype = DType::kBF16;  // of every tensor
};

struct AttentionGateBwdParams : AttentionGateFwdParams {
  void const* dy = nullptr;  // [n]
  void* d_o = nullptr;       // [n]: dy · σ(gate), FlashAttention's grad_out
  void* dgate = nullptr;     // [n]: dy · o · σ(gate) · σ(−gate)
};

void run_attention_gate_fwd(AttentionGateFwdParams const& p, cudaStream_t stream);
void run_attention_gate_bwd(AttentionGateBwdParams const& p, cudaStream_t stream);

}  // namespace fusepack
