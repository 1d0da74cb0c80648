// fusepack-bench: fused kernels vs their ATen composites on the GPU, forward and forward+backward, at the
// Qwen3.5-27B shapes. Not a test: every case first checks the fused output against the composite, then times both
// with CUDA events (median of repetitions, L2 flushed before each), and reports GB/s against the copy bandwidth
// measured in the same run.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace fusepack::bench {

struct Timing {
  double ms = 0;  // median
};

// Median time of fn() over `reps` runs, each after an L2 flush, with `warmup` untimed runs first.
Timing time_cuda(std::function<void()> const& fn, int reps = 20, int warmup = 3);

// One row of the report: `bytes` is the fewest bytes the fused pass must move (each input read once, each output
// written once), so bytes/time is the achieved bandwidth of the fused kernel.
struct Row {
  std::string op, shape, pass;  // pass: "fwd" or "fwd+bwd"
  double composite_ms = 0, fused_ms = 0, bytes = 0;
};

class Report {
 public:
  explicit Report(double copy_gbps) : copy_gbps_(copy_gbps) {}
  void add(Row row);
  void print() const;
  double copy_gbps() const { return copy_gbps_; }

 private:
  double copy_gbps_;
  std::vector<Row> rows_;
};

// Device-to-device copy bandwidth (bytes read + written per second) of a 2 GiB buffer: the ceiling used for GB/s.
double measure_copy_gbps();

// Fails loudly (std::runtime_error naming the op and tensor) when fused and composite results differ by more than
// `max_rel` in relative RMS: a benchmark never times a wrong kernel.
void expect_close(std::string const& op, std::string const& what, at::Tensor const& fused,
                  at::Tensor const& composite, double max_rel);

// One benchmark per op; each adds its rows to the report.
void bench_swiglu(Report& report);
void bench_conv1d(Report& report);
void bench_rmsnorm(Report& report);
void bench_gated_rmsnorm(Report& report);
void bench_rope(Report& report);
void bench_attention(Report& report);
void bench_gated_delta(Report& report);

}  // namespace fusepack::bench
