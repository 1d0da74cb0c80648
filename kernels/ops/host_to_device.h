// Small host tensors (a batch's token ids, cu_seqlens, a chunk table) onto the GPU without waiting for it. An ordinary
// copy from pageable host memory synchronises the stream (the host waits for every queued kernel, and the GPU then
// idles while the host queues the next ones); a copy from pinned memory is queued like a kernel.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace fusepack::ops {

// `host` (a CPU tensor) as a contiguous tensor of `dtype` on `device`. On a CUDA device the values go through a pinned
// staging buffer from the caching host allocator, which keeps it until the copy has run; on the CPU this is `to`.
at::Tensor host_to_device(at::Tensor const& host, at::ScalarType dtype, c10::Device device);
// The same for int32 values held in a vector.
at::Tensor host_to_device(std::vector<int32_t> const& values, at::ScalarType dtype, c10::Device device);

}  // namespace fusepack::ops
