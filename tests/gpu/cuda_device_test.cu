// The GPU test workflow itself: on a machine without a CUDA device the test reports SKIPPED with the reason; on a
// GPU machine it runs a kernel and checks its result, proving the toolchain, the architecture flags and the device.
#include "kernels/common/cuda_check.h"

#include "tests/support/env.h"

#include <gtest/gtest.h>

#include <vector>

namespace fusepack::test {
namespace {

__global__ void axpy_kernel(int n, float a, float const* x, float* y) {
  int const i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

TEST(CudaDevice, RunsAKernelAndGetsTheHostResult) {
  int count = 0;
  cudaError_t const status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount returned " << cudaGetErrorName(status) << " with " << count
                 << " devices";
  }
  cudaDeviceProp prop{};
  FUSEPACK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("[  device  ] %s, sm_%d%d, %d SMs, %.1f GiB\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);

  int const n = 1000 + 17;  // not a multiple of the block size: the tail guard is exercised
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = 0.5f * i, y[i] = 1.0f - i;
  float *dx = nullptr, *dy = nullptr;
  FUSEPACK_CUDA_CHECK(cudaMalloc(&dx, n * sizeof(float)));
  FUSEPACK_CUDA_CHECK(cudaMalloc(&dy, n * sizeof(float)));
  FUSEPACK_CUDA_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  FUSEPACK_CUDA_CHECK(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  axpy_kernel<<<(n + 255) / 256, 256>>>(n, 2.0f, dx, dy);
  FUSEPACK_CUDA_CHECK_LAUNCH();
  std::vector<float> out(n);
  FUSEPACK_CUDA_CHECK(cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  FUSEPACK_CUDA_CHECK(cudaFree(dx));
  FUSEPACK_CUDA_CHECK(cudaFree(dy));
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * x[i] + y[i]) << "element " << i;  // exact: 2·x is exact
}

}  // namespace
}  // namespace fusepack::test
