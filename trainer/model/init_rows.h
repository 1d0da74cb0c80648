// The CUDA side of init_parameter_rows (trainer/model/init.h): flat elements [begin, begin + n) of one parameter's
// initial value, generated on the device by init_math::init_element, the function the CPU path calls, so the two
// agree bit for bit (init_element.h says why). Raw CUDA, no torch. Measured on an H200: 2^31 elements in 22 ms for the
// normal rule (bf16 or fp32 out, ~96e9 elements/s, bound by fp64 arithmetic) and 15 ms for A_log.
#pragma once

#include "trainer/model/init_element.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace fusepack::model {

enum class InitDType { kF64, kF32, kBF16, kF16 };

struct InitRowsParams {
  void* out = nullptr;      // [n] contiguous, of `dtype`: elements [begin, begin + n) of the row-major parameter
  std::int64_t begin = 0;   // flat index of out[0] in the whole parameter
  std::int64_t n = 0;
  std::uint64_t key = 0;    // init_math::parameter_key(seed, name)
  ParameterInit init = ParameterInit::kNormal;
  double initializer_range = 0.0;  // σ of kNormal
  InitDType dtype = InitDType::kF32;
};

void run_init_rows(InitRowsParams const& p, cudaStream_t stream);

}  // namespace fusepack::model
