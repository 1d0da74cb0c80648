#include "kernels/common/cuda_check.h"
#include "trainer/model/init_rows.h"

#include <algorithm>

namespace fusepack::model {

// One element per thread and step of a grid-stride loop: each element is independent and costs a Philox block and
// a few dozen fp64 operations, so the kernel is bound by fp64 arithmetic, not by its 2–8 bytes of store.
template <InitDType kDType>
__global__ void init_rows_philox(InitRowsParams p) {
  std::int64_t const stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    double const v =
        init_math::init_element(p.key, static_cast<std::uint64_t>(p.begin + i), p.init, p.initializer_range);
    if constexpr (kDType == InitDType::kF64) {
      static_cast<double*>(p.out)[i] = v;
    } else if constexpr (kDType == InitDType::kF32) {
      static_cast<float*>(p.out)[i] = init_math::round_to_float(v);
    } else if constexpr (kDType == InitDType::kBF16) {
      static_cast<std::uint16_t*>(p.out)[i] = init_math::round_to_bf16_bits(v);
    } else {
      static_cast<std::uint16_t*>(p.out)[i] = init_math::round_to_fp16_bits(v);
    }
  }
}

void run_init_rows(InitRowsParams const& p, cudaStream_t stream) {
  if (p.n == 0) return;
  constexpr int kThreads = 256;
  int const blocks = static_cast<int>(std::min<std::int64_t>((p.n + kThreads - 1) / kThreads, 1 << 16));
  switch (p.dtype) {
    case InitDType::kF64: init_rows_philox<InitDType::kF64><<<blocks, kThreads, 0, stream>>>(p); break;
    case InitDType::kF32: init_rows_philox<InitDType::kF32><<<blocks, kThreads, 0, stream>>>(p); break;
    case InitDType::kBF16: init_rows_philox<InitDType::kBF16><<<blocks, kThreads, 0, stream>>>(p); break;
    case InitDType::kF16: init_rows_philox<InitDType::kF16><<<blocks, kThreads, 0, stream>>>(p); break;
  }
  FUSEPACK_CUDA_CHECK_LAUNCH();
}

}  // namespace fusepack::model
