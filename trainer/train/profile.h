// One profiled optimizer step (fusepack-train --profile-step N): what the seeds' trace analysis printed — CPU op
// calls, GPU kernels launched, the step's wall (CPU) time vs the GPU's kernel time, the most frequent ops and kernels,
// and which implementation ran the model's ops — taken with PyTorch's own profiler (Kineto) around the step.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fusepack::train {

using NameCounts = std::vector<std::pair<std::string, std::int64_t>>;  // most frequent first, then by name

struct StepProfile {
  std::int64_t step = 0;
  std::string backend;              // "composite" or "fused": every fusepack op ran it (the ops refuse, never fall back)
  std::int64_t cpu_op_calls = 0;    // ATen/autograd op calls recorded on the CPU, nested ones included (torch.profiler;
                                    // fusepack's own op ranges are counted in op_implementations instead)
  std::int64_t gpu_kernels = 0;     // kernels launched on the GPU (memory copies and sets not counted)
  std::int64_t gpu_memory_ops = 0;  // GPU memcpy/memset activities
  double wall_seconds = 0;          // the step from its first micro-batch to the end of the update, GPU waited for
  double gpu_kernel_seconds = 0;    // Σ of the kernels' durations
  // Communication kernels (NCCL's) of a sharded run on GPUs, and how much of their time other kernels ran at the same
  // time: the overlap of the all-gathers and reduce-scatters with compute (the rest is exposed communication).
  std::int64_t comm_kernels = 0;
  double comm_kernel_seconds = 0;
  double comm_overlapped_seconds = 0;
  NameCounts top_cpu_ops;           // up to 10
  NameCounts top_gpu_kernels;       // up to 10
  NameCounts fusepack_kernels;      // GPU kernels of fusepack's own (kernels/ names), every one
  // Every fusepack op call of the step by the implementation that ran it, as the op recorded it
  // (kernels/ops/op_scope.h): "rmsnorm [fused]" -> 17. Observed, not assumed from the requested backend.
  NameCounts op_implementations;
  std::int64_t ops_not_on_backend = 0;  // op calls whose implementation is not `backend` (0 unless a bug)
};

// Starts PyTorch's profiler on construction (CPU activities, and CUDA's when `cuda`); stop() ends it and counts.
// Throws std::runtime_error when a profiler is already running in this thread.
class StepProfiler {
 public:
  StepProfiler(std::int64_t step, std::string backend, bool cuda, int cuda_device);
  ~StepProfiler();  // stops the profiler if stop() was not called (an exception during the step)
  StepProfiler(StepProfiler const&) = delete;
  StepProfiler& operator=(StepProfiler const&) = delete;

  StepProfile stop();

 private:
  std::int64_t step_;
  std::string backend_;
  bool cuda_;
  int cuda_device_;
  bool running_ = false;
  std::uint64_t start_ns_ = 0;
};

// The report, several lines: "profile of step 3 (backend composite): 12,345 CPU op calls, 0 GPU kernels, ...".
std::string profile_text(StepProfile const& p);

}  // namespace fusepack::train
