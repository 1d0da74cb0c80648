#include "kernels/bench/bench.h"

#include "kernels/common/cuda_check.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace fusepack::bench {

Timing time_cuda(std::function<void()> const& fn, int reps, int warmup) {
  static at::Tensor flush = at::empty({256 << 20}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
  for (int i = 0; i < warmup; ++i) fn();
  cudaStream_t const stream = at::cuda::getCurrentCUDAStream();
  std::vector<float> times;
  cudaEvent_t start, stop;
  FUSEPACK_CUDA_CHECK(cudaEventCreate(&start));
  FUSEPACK_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < reps; ++i) {
    flush.zero_();  // 256 MiB, several times the 50 MiB L2
    FUSEPACK_CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    FUSEPACK_CUDA_CHECK(cudaEventRecord(stop, stream));
    FUSEPACK_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FUSEPACK_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  FUSEPACK_CUDA_CHECK(cudaEventDestroy(start));
  FUSEPACK_CUDA_CHECK(cudaEventDestroy(stop));
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return {times[times.size() / 2]};
}

double measure_copy_gbps() {
  int64_t const n = int64_t(2) << 30;
  auto opts = at::TensorOptions().dtype(at::kByte).device(at::kCUDA);
  at::Tensor a = at::ones({n}, opts), b = at::empty({n}, opts);
  Timing const t = time_cuda([&] { b.copy_(a); }, 10, 2);
  return 2.0 * n / (t.ms * 1e-3) / 1e9;
}

void expect_close(std::string const& op, std::string const& what, at::Tensor const& fused,
                  at::Tensor const& composite, double max_rel) {
  at::Tensor const f = fused.detach().to(at::kDouble), c = composite.detach().to(at::kDouble);
  double const err = (f - c).norm().item<double>(), ref = c.norm().item<double>();
  double const rel = ref > 0 ? err / ref : err;
  if (!(rel <= max_rel)) {
    throw std::runtime_error(op + ": " + what + " of the fused kernel differs from the composite by relative RMS " +
                             std::to_string(rel) + " > " + std::to_string(max_rel) + "; not timing a wrong kernel");
  }
}

void Report::add(Row row) { rows_.push_back(std::move(row)); }

void Report::print() const {
  std::printf("\ndevice-to-device copy bandwidth measured in this run: %.0f GB/s\n", copy_gbps_);
  std::printf("%-16s %-28s %-8s %12s %10s %8s %10s %7s\n", "op", "shape", "pass", "composite ms", "fused ms",
              "speedup", "fused GB/s", "of copy");
  for (Row const& r : rows_) {
    double const gbps = r.bytes / (r.fused_ms * 1e-3) / 1e9;
    std::printf("%-16s %-28s %-8s %12.4f %10.4f %7.1fx %10.0f %6.0f%%\n", r.op.c_str(), r.shape.c_str(),
                r.pass.c_str(), r.composite_ms, r.fused_ms, r.composite_ms / r.fused_ms, gbps,
                100.0 * gbps / copy_gbps_);
  }
}

}  // namespace fusepack::bench
