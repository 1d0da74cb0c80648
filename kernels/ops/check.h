// Input validation at the LibTorch boundary: every failure is a c10::Error (TORCH_CHECK) whose message names the
// op, the tensor and the dimension, with what was expected and what was given.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace fusepack::ops {

// `t` must be defined with `dims` dimensions; -1 in `sizes` accepts any size in that dimension.
void check_sizes(char const* op, char const* name, at::Tensor const& t, std::vector<int64_t> const& sizes);
// Same dtype and device as `like`.
void check_same_dtype_device(char const* op, char const* name, at::Tensor const& t, char const* like_name,
                             at::Tensor const& like);
// The fused path's requirements: built with CUDA, a CUDA tensor, contiguous, dtype one of fp32/bf16/fp16.
void check_fused_input(char const* op, char const* name, at::Tensor const& t);
// cu_seqlens of T packed tokens: 1-D int32 with at least 2 entries, cu[0] == 0, non-decreasing, cu[N] == T.
// Reads the values (a device-to-host copy when on the GPU) and returns them on the host; a second call with the same,
// unmodified tensor returns the values it validated before without copying again.
std::vector<int32_t> check_cu_seqlens(char const* op, at::Tensor const& cu_seqlens, int64_t T);
// Tells check_cu_seqlens that `cu_seqlens` holds `values` (checked here, on the host, with T = values.back()), so its
// next call with the same, unmodified tensor on this thread reads nothing from the device. For the code that copied
// the tensor from host values it still holds (a batch's cu_seqlens): without it the first op of a step copies them
// back, which waits for all queued GPU work (the previous step's optimizer) before the host can queue more.
void note_cu_seqlens(char const* op, at::Tensor const& cu_seqlens, std::vector<int32_t> values);

}  // namespace fusepack::ops
