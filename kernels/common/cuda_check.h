// Error checks for CUDA runtime calls and kernel launches. Library code throws; only a tool's main() exits.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fusepack {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline void cuda_check(cudaError_t status, char const* what, char const* file, int line) {
  if (status != cudaSuccess) {
    throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                    cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
  }
}

}  // namespace fusepack

#define FUSEPACK_CUDA_CHECK(call) ::fusepack::cuda_check((call), #call, __FILE__, __LINE__)
// After every <<<>>>: launch-configuration errors surface here, not at the next unrelated call.
#define FUSEPACK_CUDA_CHECK_LAUNCH() ::fusepack::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
