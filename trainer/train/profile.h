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

// One profiler record as attribute_time reads it: a plain copy of Kineto's fields, so tests can build traces.
struct TraceEvent {
  std::string name;
  bool kernel = false;               // a GPU kernel; otherwise a CPU range (an op, an autograd node, a named range)
  std::uint64_t thread = 0;          // CPU ranges: the thread that ran it
  std::uint64_t start_ns = 0, end_ns = 0;
  std::int64_t sequence_nr = -1;     // CPU ranges: autograd's sequence number (-1: none)
  std::uint64_t forward_thread = 0;  // CPU ranges: the thread whose sequence numbers sequence_nr counts
  std::uint64_t correlation = 0;     // CPU ranges: their id; kernels: the id of the CPU op that launched them (0: none)
};

// GPU time of the kernels launched inside one scope, split by pass. A scope is a fusepack op ("gated_delta", its
// forward and backward), a GEMM group ("GEMM projections", "GEMM mlp"; the head's GEMMs are linear_cross_entropy's),
// "optimizer" (clipping and AdamW), or "other: NAME" with NAME the outermost ATen op (forward) or autograd node
// (backward) that launched kernels outside every named scope.
struct ScopeTime {
  std::string scope;
  double forward_seconds = 0, backward_seconds = 0;
  std::int64_t kernels = 0;
};

// One kind of decoder layer ("linear_attention", "full_attention"): how many ran, and summed over them the host time
// of their forward (the layer's range) and backward (the autograd nodes their forward created, recomputation of a
// checkpointed layer included) and the GPU time of the kernels those launched.
struct LayerTime {
  std::string type;
  std::int64_t layers = 0;
  double forward_host_seconds = 0, backward_host_seconds = 0;
  double forward_gpu_seconds = 0, backward_gpu_seconds = 0;
};

struct TimeAttribution {
  std::vector<ScopeTime> scopes;  // most GPU time first
  std::vector<LayerTime> layers;  // by type name
};

// Attributes each kernel to the scopes of the CPU op that launched it (Kineto's correlation ids). Forward ops take the
// innermost enclosing range of kernels/ops/op_scope.h (an op, a GEMM group, a layer, the optimizer). A backward node
// takes the scopes of the forward op that created it: the last forward op that carries its sequence number, the
// number autograd gives the node when the forward op creates it.
TimeAttribution attribute_time(std::vector<TraceEvent> const& events);

// Time of one name (a GPU kernel; an ATen op, autograd node, fusepack range or CUDA API call) summed over its
// launches or calls.
struct NamedTime {
  std::string name;
  double seconds = 0;
  std::int64_t count = 0;  // launches or calls
};

// The `most` names with the most host self time, most first (ties by name), from the CPU ranges of `events` (kernels
// are ignored). Self only: what its nested calls on the same thread took is theirs (a cudaMalloc inside an op is the
// cudaMalloc's). Ranges on one thread nest (a range that starts inside another ends inside it: the profiler's ranges
// are scopes); a range's self time is its duration less its direct children's.
std::vector<NamedTime> host_self_time(std::vector<TraceEvent> const& events, std::size_t most);

// Where the GPU had nothing to run in a window of the step: the window less the union of its GPU activities (events
// with `kernel` set: kernels, and memory copies and sets), split into before the first activity, after the last, and
// the stretches between two. Each stretch between is put down to where the host was when it began: on the thread of
// the CPU op that launched the activity ending it, the ranges open at that moment, named "outermost > innermost" (a
// device-to-host read under the optimizer: "fusepack:range optimizer > cudaStreamSynchronize"; "(in no range)" for
// code outside every range). A stretch whose ending activity was launched before the stretch began (its launching op
// had returned by then) is not the host's: it is "(launched in time)", the gaps between kernels queued back to back.
struct GpuIdle {
  double window_seconds = 0;
  double idle_seconds = 0;  // before + after + between
  double before_first_seconds = 0, after_last_seconds = 0;  // the whole window when it holds no activity
  // The part of before_first_seconds before any CPU range began (on any thread): no op of the step was running yet
  // (the profiler's own start-up, or host code outside every range).
  double before_first_host_seconds = 0;
  // What the host did before the first GPU activity: host_self_time over the ranges clipped to that stretch, up to
  // `most` names (count = ranges that overlap it).
  std::vector<NamedTime> before_first_host;
  double between_seconds = 0;
  std::int64_t stretches = 0;      // idle stretches between two activities
  std::vector<NamedTime> by_host;  // up to `most`, most time first; count = stretches
};
GpuIdle gpu_idle(std::vector<TraceEvent> const& events, std::uint64_t window_start_ns, std::uint64_t window_end_ns,
                 std::size_t most);

struct StepProfile {
  std::int64_t step = 0;
  std::string backend;              // "composite" or "fused": every fusepack op ran it (the ops refuse, never fall back)
  std::int64_t cpu_op_calls = 0;    // ATen/autograd op calls recorded on the CPU, nested ones included (torch.profiler;
                                    // fusepack's own op ranges are counted in op_implementations instead)
  std::int64_t cuda_api_calls = 0;  // CUDA runtime and driver calls (cudaLaunchKernel, ...), not counted as ops
  std::int64_t gpu_kernels = 0;     // kernels launched on the GPU (memory copies and sets not counted)
  std::int64_t gpu_memory_ops = 0;  // GPU memcpy/memset activities
  double wall_seconds = 0;          // the step from its first micro-batch to the end of the update, GPU waited for
  double gpu_kernel_seconds = 0;    // Σ of the kernels' durations
  GpuIdle gpu_idle;                 // over the step's wall time (CUDA only); by_host up to 8
  // Communication kernels (NCCL's) of a sharded run on GPUs, and how much of their time other kernels ran at the same
  // time: the overlap of the all-gathers and reduce-scatters with compute (the rest is exposed communication).
  std::int64_t comm_kernels = 0;
  double comm_kernel_seconds = 0;
  double comm_overlapped_seconds = 0;
  NameCounts top_cpu_ops;           // up to 10
  NameCounts top_gpu_kernels;       // up to 10
  std::vector<NamedTime> slowest_gpu_kernels;  // up to 10, by summed duration; count = launches
  NameCounts fusepack_kernels;      // GPU kernels of fusepack's own (kernels/ names), every one
  // Every fusepack op call of the step by the implementation that ran it, as the op recorded it
  // (kernels/ops/op_scope.h): "rmsnorm [fused]" -> 17. Observed, not assumed from the requested backend.
  NameCounts op_implementations;
  std::int64_t ops_not_on_backend = 0;  // op calls whose implementation is not `backend` (0 unless a bug)
  TimeAttribution time;                  // GPU time by scope, host and GPU time per decoder layer
  // Up to 12, count = calls: where the step's host time went (what a slow first step pays).
  std::vector<NamedTime> host_self;
  // CUDA: the caching allocator's bytes allocated when the step began, and the most allocated during it; the peak of
  // the run before the step (the step's measurement resets the allocator's peak: the run's peak is the larger one).
  std::int64_t start_bytes = -1, peak_bytes = -1, peak_bytes_before = -1;
};

// PyTorch's profiler around one step (CPU activities, and CUDA's when `cuda`), in torch.profiler's phases: the
// constructor prepares it (warm-up: CUPTI enabled and collecting, its buffers allocated, records discarded), start()
// opens the measured window and stop() closes it and counts. Constructed a step ahead, the profiler's own start-up
// (CUPTI's first buffer requests, ~2-3 ms on an H200) falls in the step before and not in the measured one.
// Throws std::runtime_error when a profiler is already running in this thread.
class StepProfiler {
 public:
  StepProfiler(std::int64_t step, std::string backend, bool cuda, int cuda_device);
  ~StepProfiler();  // stops the profiler if stop() was not called (an exception during the step)
  StepProfiler(StepProfiler const&) = delete;
  StepProfiler& operator=(StepProfiler const&) = delete;

  void start();  // waits for the GPU's queued work first: nothing launched before is in the window
  StepProfile stop();

 private:
  std::int64_t step_;
  std::string backend_;
  bool cuda_;
  int cuda_device_;
  bool prepared_ = false, running_ = false;
  std::uint64_t start_ns_ = 0;
  std::uint64_t start_epoch_ns_ = 0;  // the profiler's clock (its events' time base), for gpu_idle's window
  std::int64_t start_bytes_ = -1, peak_bytes_before_ = -1;
};

// The GPU time by scope (the 16 largest, then the rest summed) and the per-layer table, shares of
// `gpu_kernel_seconds`; "" when `t` is empty.
std::string time_attribution_text(TimeAttribution const& t, double gpu_kernel_seconds);

// The report, several lines: "profile of step 3 (backend composite): 12,345 CPU op calls, 0 GPU kernels, ...".
std::string profile_text(StepProfile const& p);

}  // namespace fusepack::train
