#include "kernels/ops/host_to_device.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace fusepack::ops {

at::Tensor host_to_device(at::Tensor const& host, at::ScalarType dtype, c10::Device device) {
  TORCH_CHECK(host.device().is_cpu(), "host_to_device: the source must be a CPU tensor; got one on ", host.device());
  if (!device.is_cuda()) return host.to(at::TensorOptions().dtype(dtype).device(device)).contiguous();
  at::Tensor pinned = at::empty(host.sizes(), at::TensorOptions().dtype(dtype).pinned_memory(true));
  pinned.copy_(host);
  return pinned.to(device, /*non_blocking=*/true);
}

at::Tensor host_to_device(std::vector<int32_t> const& values, at::ScalarType dtype, c10::Device device) {
  at::Tensor host = at::empty({static_cast<int64_t>(values.size())}, at::TensorOptions().dtype(at::kInt));
  std::copy(values.begin(), values.end(), host.data_ptr<int32_t>());
  return host_to_device(host, dtype, device);
}

}  // namespace fusepack::ops
