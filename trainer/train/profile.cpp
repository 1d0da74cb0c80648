#include "trainer/train/profile.h"

#include "kernels/ops/op_scope.h"
#include "trainer/train/device_memory.h"
#include "trainer/train/report.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/ApproximateClock.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

namespace fusepack::train {
namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

NameCounts most_frequent(std::map<std::string, std::int64_t> const& counts, std::size_t limit) {
  NameCounts out(counts.begin(), counts.end());
  std::stable_sort(out.begin(), out.end(), [](auto const& a, auto const& b) { return a.second > b.second; });
  if (out.size() > limit) out.resize(limit);
  return out;
}

// The `limit` names with the most time, most first; equal times keep the map's (name) order.
std::vector<NamedTime> most_time(std::map<std::string, NamedTime> by_name, std::size_t limit) {
  std::vector<NamedTime> out;
  for (auto& [name, t] : by_name) out.push_back(std::move(t));
  std::stable_sort(out.begin(), out.end(),
                   [](NamedTime const& a, NamedTime const& b) { return a.seconds > b.seconds; });
  if (out.size() > limit) out.resize(limit);
  return out;
}

bool is_memory_activity(std::string const& name) {
  return name.rfind("Memcpy", 0) == 0 || name.rfind("Memset", 0) == 0 || name.rfind("cudaMemcpy", 0) == 0 ||
         name.rfind("cudaMemset", 0) == 0;
}

std::string shortened(std::string const& name, std::size_t limit = 90) {
  return name.size() <= limit ? name : name.substr(0, limit - 3) + "...";
}

void sync_cuda(bool cuda, int device) {
  if (cuda) at::detail::getCUDAHooks().deviceSynchronize(static_cast<c10::DeviceIndex>(device));
}

std::set<ActivityType> activities(bool cuda) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (cuda) a.insert(ActivityType::CUDA);
  return a;
}

// Σ of the `comm` intervals' lengths, and of their parts covered by the union of the `compute` intervals (seconds).
std::pair<double, double> overlap(std::vector<std::pair<std::int64_t, std::int64_t>> const& comm,
                                  std::vector<std::pair<std::int64_t, std::int64_t>> compute) {
  std::sort(compute.begin(), compute.end());
  std::vector<std::pair<std::int64_t, std::int64_t>> merged;
  for (auto const& iv : compute) {
    if (!merged.empty() && iv.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, iv.second);
    } else {
      merged.push_back(iv);
    }
  }
  double total = 0, covered = 0;
  for (auto const& [begin, end] : comm) {
    total += static_cast<double>(end - begin) * 1e-9;
    auto it = std::upper_bound(merged.begin(), merged.end(), std::pair<std::int64_t, std::int64_t>{begin, begin});
    if (it != merged.begin()) --it;
    for (; it != merged.end() && it->first < end; ++it) {
      std::int64_t const lo = std::max(begin, it->first), hi = std::min(end, it->second);
      if (hi > lo) covered += static_cast<double>(hi - lo) * 1e-9;
    }
  }
  return {total, covered};
}

// ---- Attribution of time to scopes

constexpr char kEvaluateFunction[] = "autograd::engine::evaluate_function: ";
constexpr char kGemmRange[] = FUSEPACK_RANGE_PREFIX "gemm ";
constexpr char kLayerRange[] = FUSEPACK_RANGE_PREFIX "layer ";
constexpr char kOptimizerRange[] = FUSEPACK_RANGE_PREFIX "optimizer";

bool starts_with(std::string const& s, char const* prefix) { return s.rfind(prefix, 0) == 0; }

// The scope a range names ("gated_delta", "GEMM mlp", "optimizer"), or "" when it names none.
std::string scope_of_range(std::string const& name) {
  std::string const op_prefix = FUSEPACK_OP_SCOPE_PREFIX;
  if (starts_with(name, FUSEPACK_OP_SCOPE_PREFIX) && name.back() == ']') {  // "fusepack::rmsnorm backward [fused]"
    std::string op = name.substr(op_prefix.size(), name.rfind(" [") - op_prefix.size());
    std::size_t const backward = op.rfind(" backward");
    if (backward != std::string::npos && backward + 9 == op.size()) op.resize(backward);
    return op;
  }
  if (starts_with(name, kGemmRange)) return "GEMM " + name.substr(sizeof kGemmRange - 1);
  if (name == kOptimizerRange) return "optimizer";
  return "";
}

// "fusepack.layer 3 linear_attention" -> "linear_attention"; "" for other names.
std::string layer_type_of_range(std::string const& name) {
  if (!starts_with(name, kLayerRange)) return "";
  std::size_t const space = name.find(' ', sizeof kLayerRange - 1);
  return space == std::string::npos ? "layer" : name.substr(space + 1);
}

// What a CPU range passes on to the ranges and kernels under it.
struct Context {
  std::string scope;           // innermost named scope; "" when none
  std::string top_op;          // outermost ATen op (or, in a backward, autograd node) since the last named range
  std::string layer_type;      // the decoder layer's kind; "" outside layers
  bool backward = false;       // inside an autograd node's evaluation
  bool layer_counted = false;  // an enclosing range already counts toward its layer's backward host time
};

}  // namespace

TimeAttribution attribute_time(std::vector<TraceEvent> const& events) {
  // CPU ranges by thread, each thread's in start order (a parent before its children: longer first on equal starts).
  std::vector<std::size_t> cpu;
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (!events[i].kernel) cpu.push_back(i);
  }
  std::sort(cpu.begin(), cpu.end(), [&](std::size_t a, std::size_t b) {
    TraceEvent const &x = events[a], &y = events[b];
    return std::make_tuple(x.thread, x.start_ns, y.end_ns, a) < std::make_tuple(y.thread, y.start_ns, x.end_ns, b);
  });
  std::vector<Context> context(events.size());
  std::map<std::pair<std::uint64_t, std::int64_t>, std::size_t> creator;  // (thread, sequence nr) -> forward op
  std::map<std::int64_t, std::size_t> creator_any_thread;
  std::map<std::string, LayerTime> layers;
  // Pass 1 gives every forward op its scopes; pass 2 gives backward nodes their creators' and measures the host time.
  for (int pass = 1; pass <= 2; ++pass) {
    std::vector<std::size_t> stack;
    for (std::size_t k = 0; k < cpu.size(); ++k) {
      std::size_t const i = cpu[k];
      TraceEvent const& e = events[i];
      if (k > 0 && events[cpu[k - 1]].thread != e.thread) stack.clear();
      while (!stack.empty() && events[stack.back()].end_ns <= e.start_ns) stack.pop_back();
      Context c = stack.empty() ? Context{} : context[stack.back()];
      double const seconds = static_cast<double>(e.end_ns - e.start_ns) * 1e-9;
      std::string const scope = scope_of_range(e.name), layer_type = layer_type_of_range(e.name);
      if (starts_with(e.name, kEvaluateFunction)) {
        c.backward = true;
        c.top_op = e.name.substr(sizeof kEvaluateFunction - 1);
        if (pass == 2 && e.sequence_nr >= 0) {
          auto it = creator.find({e.forward_thread, e.sequence_nr});
          std::size_t const* found = it != creator.end() ? &it->second : nullptr;
          auto any = creator_any_thread.find(e.sequence_nr);
          if (found == nullptr && any != creator_any_thread.end()) found = &any->second;
          if (found != nullptr) {
            if (c.scope.empty()) c.scope = context[*found].scope;
            if (c.layer_type.empty()) c.layer_type = context[*found].layer_type;
          }
        }
      } else if (!scope.empty()) {
        c.scope = scope;
        c.top_op.clear();
      } else if (!layer_type.empty()) {
        c.layer_type = layer_type;
        c.top_op.clear();
        if (pass == 2 && !c.backward) {
          layers[layer_type].layers += 1;
          layers[layer_type].forward_host_seconds += seconds;
        }
      } else if (c.top_op.empty()) {
        c.top_op = e.name;
      }
      // A backward's host time goes to its layer once, at the outermost range that knows the layer: an autograd node
      // its forward created, or a checkpointed layer's recomputation.
      if (pass == 2 && c.backward && !c.layer_type.empty() && !c.layer_counted &&
          (starts_with(e.name, kEvaluateFunction) || !layer_type.empty())) {
        layers[c.layer_type].backward_host_seconds += seconds;
        c.layer_counted = true;
      }
      context[i] = c;
      // The last op carrying a number created the node: forward ops, and those of a checkpointed layer's
      // recomputation (in a backward, under a layer's range; other ranges in a backward carry their node's number).
      if (pass == 1 && e.sequence_nr >= 0 && !starts_with(e.name, kEvaluateFunction) &&
          (!c.backward || !c.layer_type.empty())) {
        creator[{e.thread, e.sequence_nr}] = i;
        if (!c.backward) creator_any_thread[e.sequence_nr] = i;
      }
      stack.push_back(i);
    }
  }
  std::map<std::uint64_t, std::size_t> launcher;  // correlation id -> CPU op
  for (std::size_t i : cpu) {
    if (events[i].correlation != 0) launcher.emplace(events[i].correlation, i);
  }
  std::map<std::string, ScopeTime> scopes;
  for (TraceEvent const& e : events) {
    if (!e.kernel) continue;
    auto const it = launcher.find(e.correlation);
    Context const c = it == launcher.end() ? Context{} : context[it->second];
    std::string const scope =
        !c.scope.empty() ? c.scope
                         : "other: " + (it == launcher.end() ? std::string("(no launching op recorded)") : c.top_op);
    double const seconds = static_cast<double>(e.end_ns - e.start_ns) * 1e-9;
    ScopeTime& t = scopes[scope];
    t.scope = scope;
    (c.backward ? t.backward_seconds : t.forward_seconds) += seconds;
    t.kernels += 1;
    if (!c.layer_type.empty()) {
      LayerTime& l = layers[c.layer_type];
      (c.backward ? l.backward_gpu_seconds : l.forward_gpu_seconds) += seconds;
    }
  }
  TimeAttribution out;
  for (auto& [name, t] : scopes) out.scopes.push_back(t);
  std::stable_sort(out.scopes.begin(), out.scopes.end(), [](ScopeTime const& a, ScopeTime const& b) {
    return a.forward_seconds + a.backward_seconds > b.forward_seconds + b.backward_seconds;
  });
  for (auto& [type, l] : layers) {
    l.type = type;
    out.layers.push_back(l);
  }
  return out;
}

StepProfiler::StepProfiler(std::int64_t step, std::string backend, bool cuda, int cuda_device)
    : step_(step), backend_(std::move(backend)), cuda_(cuda), cuda_device_(cuda_device) {
  if (prof::isProfilerEnabledInMainThread()) {
    throw std::runtime_error("--profile-step: a PyTorch profiler is already running in this process");
  }
  // A CPU-only profile on a machine without a GPU: Kineto still probes for devices and logs "gpuGetDeviceCount failed"
  // as an ERROR; nothing is wrong (there is no GPU to count), so its logging is quietened unless the user set it.
  if (!cuda_) ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  prof::prepareProfiler(ProfilerConfig(ProfilerState::KINETO), activities(cuda_));
  prepared_ = true;
}

void StepProfiler::start() {
  if (!prepared_ || running_) throw std::runtime_error("StepProfiler::start: called twice");
  sync_cuda(cuda_, cuda_device_);  // nothing of earlier steps in the profiled window
  if (cuda_) {
    c10::Device const device(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_device_));
    AllocatedBytes const allocated = allocated_bytes(device);
    start_bytes_ = allocated.current;
    peak_bytes_before_ = allocated.peak;
    reset_peak_allocated_bytes(device);
  }
  prof::enableProfiler(ProfilerConfig(ProfilerState::KINETO), activities(cuda_));
  prepared_ = false;
  running_ = true;
  start_ns_ = now_ns();
  start_epoch_ns_ = static_cast<std::uint64_t>(c10::getTime());
}

StepProfiler::~StepProfiler() {
  if (!prepared_ && !running_) return;
  try {  // a prepared profiler is ended as torch.profiler ends one stopped in warm-up: started, then stopped
    if (prepared_) prof::enableProfiler(ProfilerConfig(ProfilerState::KINETO), activities(cuda_));
    prof::disableProfiler();
  } catch (...) {  // already unwinding: the step's own exception is the one to report
  }
}

StepProfile StepProfiler::stop() {
  if (!running_) throw std::runtime_error("StepProfiler::stop: start() was not called");
  sync_cuda(cuda_, cuda_device_);  // the step's kernels have finished: their records are complete
  std::uint64_t const end_ns = now_ns();
  auto const end_epoch_ns = static_cast<std::uint64_t>(c10::getTime());
  std::unique_ptr<prof::ProfilerResult> const result = prof::disableProfiler();
  running_ = false;

  StepProfile p;
  p.step = step_;
  p.backend = backend_;
  p.wall_seconds = static_cast<double>(end_ns - start_ns_) * 1e-9;
  if (cuda_) {
    p.peak_bytes = allocated_bytes(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_device_))).peak;
    p.start_bytes = start_bytes_;
    p.peak_bytes_before = peak_bytes_before_;
  }
  std::map<std::string, std::int64_t> cpu, gpu, ours, implementations;
  std::map<std::string, NamedTime> gpu_time;
  std::vector<std::pair<std::int64_t, std::int64_t>> comm, compute;  // kernel intervals [start, end) in ns
  std::vector<TraceEvent> trace, api, memory;
  std::string const scope_prefix = FUSEPACK_OP_SCOPE_PREFIX, implementation_suffix = " [" + backend_ + "]";
  for (prof::KinetoEvent const& e : result->events()) {
    std::string const name = e.name();
    auto const type = static_cast<libkineto::ActivityType>(e.activityType());
    if (e.deviceType() == c10::DeviceType::CPU) {
      if (e.isAsync() || e.isHiddenEvent()) continue;
      if (type == libkineto::ActivityType::CUDA_RUNTIME || type == libkineto::ActivityType::CUDA_DRIVER) {
        ++p.cuda_api_calls;  // cudaLaunchKernel and the like: the host's cost of a launch, not an op
        TraceEvent t;        // host time only (not a scope of attribute_time)
        t.name = name;
        t.thread = e.startThreadId();
        t.start_ns = e.startNs();
        t.end_ns = e.endNs();
        api.push_back(std::move(t));
        continue;
      }
      TraceEvent t;
      t.name = name;
      t.thread = e.startThreadId();
      t.start_ns = e.startNs();
      t.end_ns = e.endNs();
      t.sequence_nr = e.sequenceNr();
      t.forward_thread = e.fwdThreadId();
      t.correlation = e.correlationId();
      trace.push_back(std::move(t));
      if (name.rfind(scope_prefix, 0) == 0 && name.back() == ']') {  // an op range of kernels/ops/op_scope.h
        ++implementations[name.substr(scope_prefix.size())];
        bool const on_backend = name.size() >= implementation_suffix.size() &&
                                name.compare(name.size() - implementation_suffix.size(), std::string::npos,
                                             implementation_suffix) == 0;
        if (!on_backend) ++p.ops_not_on_backend;
        continue;
      }
      if (name.rfind(FUSEPACK_RANGE_PREFIX, 0) == 0) continue;  // a layer, GEMM group or optimizer range
      ++p.cpu_op_calls;
      ++cpu[name];
    } else if (e.deviceType() == c10::DeviceType::CUDA) {
      // A named CPU range's span on the GPU timeline (Kineto's GPU user annotation): not a kernel.
      if (type == libkineto::ActivityType::GPU_USER_ANNOTATION) continue;
      TraceEvent t;  // a GPU activity, linked to the CPU op that launched it
      t.name = name;
      t.kernel = true;
      t.start_ns = e.startNs();
      t.end_ns = e.startNs() + e.durationNs();
      t.correlation = e.linkedCorrelationId();
      if (is_memory_activity(name)) {
        ++p.gpu_memory_ops;
        memory.push_back(std::move(t));  // for gpu_idle only (not kernel time)
        continue;
      }
      ++p.gpu_kernels;
      ++gpu[name];
      p.gpu_kernel_seconds += static_cast<double>(e.durationNs()) * 1e-9;
      NamedTime& k = gpu_time[name];
      k.name = name;
      k.seconds += static_cast<double>(e.durationNs()) * 1e-9;
      ++k.count;
      std::pair<std::int64_t, std::int64_t> const span{static_cast<std::int64_t>(e.startNs()),
                                                       static_cast<std::int64_t>(e.startNs() + e.durationNs())};
      (name.rfind("nccl", 0) == 0 ? comm : compute).push_back(span);
      trace.push_back(std::move(t));
      if (name.find("fusepack::") != std::string::npos) ++ours[name];
    }
  }
  p.comm_kernels = static_cast<std::int64_t>(comm.size());
  std::tie(p.comm_kernel_seconds, p.comm_overlapped_seconds) = overlap(comm, std::move(compute));
  p.top_cpu_ops = most_frequent(cpu, 10);
  p.top_gpu_kernels = most_frequent(gpu, 10);
  p.slowest_gpu_kernels = most_time(std::move(gpu_time), 10);
  p.fusepack_kernels = most_frequent(ours, ours.size());
  p.op_implementations = most_frequent(implementations, implementations.size());
  p.time = attribute_time(trace);
  trace.insert(trace.end(), std::make_move_iterator(api.begin()), std::make_move_iterator(api.end()));
  p.host_self = host_self_time(trace, 12);
  if (cuda_) {
    trace.insert(trace.end(), std::make_move_iterator(memory.begin()), std::make_move_iterator(memory.end()));
    p.gpu_idle = gpu_idle(trace, start_epoch_ns_, end_epoch_ns, 8);
  }
  return p;
}

std::vector<NamedTime> host_self_time(std::vector<TraceEvent> const& events, std::size_t most) {
  std::map<std::uint64_t, std::vector<TraceEvent const*>> by_thread;
  for (TraceEvent const& e : events) {
    if (!e.kernel) by_thread[e.thread].push_back(&e);
  }
  std::map<std::string, NamedTime> by_name;
  for (auto& [thread, ranges] : by_thread) {
    // Parents before their children: by start, the longer first when two start together.
    std::stable_sort(ranges.begin(), ranges.end(), [](TraceEvent const* a, TraceEvent const* b) {
      return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns > b->end_ns;
    });
    struct Open {
      TraceEvent const* range;
      std::uint64_t children_ns;
    };
    std::vector<Open> open;
    auto close = [&](Open const& o) {
      NamedTime& h = by_name[o.range->name];
      h.name = o.range->name;
      std::uint64_t const duration = o.range->end_ns - o.range->start_ns;
      h.seconds += static_cast<double>(duration - std::min(duration, o.children_ns)) * 1e-9;
      ++h.count;
    };
    for (TraceEvent const* r : ranges) {
      while (!open.empty() && open.back().range->end_ns <= r->start_ns) {
        close(open.back());
        open.pop_back();
      }
      if (!open.empty()) open.back().children_ns += std::min(r->end_ns, open.back().range->end_ns) - r->start_ns;
      open.push_back({r, 0});
    }
    for (auto it = open.rbegin(); it != open.rend(); ++it) close(*it);
  }
  return most_time(std::move(by_name), most);
}

GpuIdle gpu_idle(std::vector<TraceEvent> const& events, std::uint64_t window_start_ns, std::uint64_t window_end_ns,
                 std::size_t most) {
  GpuIdle out;
  if (window_end_ns <= window_start_ns) return out;
  out.window_seconds = static_cast<double>(window_end_ns - window_start_ns) * 1e-9;
  // The activities clipped to the window, merged into busy stretches; a stretch remembers the activity that began it.
  std::vector<std::size_t> gpu;
  for (std::size_t i = 0; i < events.size(); ++i) {
    TraceEvent const& e = events[i];
    if (e.kernel && e.end_ns > window_start_ns && e.start_ns < window_end_ns && e.end_ns > e.start_ns) gpu.push_back(i);
  }
  std::sort(gpu.begin(), gpu.end(), [&](std::size_t a, std::size_t b) {
    return std::make_pair(events[a].start_ns, a) < std::make_pair(events[b].start_ns, b);
  });
  struct Busy {
    std::uint64_t begin, end;
    std::size_t first;  // the activity that began it
  };
  std::vector<Busy> busy;
  for (std::size_t i : gpu) {
    std::uint64_t const begin = std::max(events[i].start_ns, window_start_ns);
    std::uint64_t const end = std::min(events[i].end_ns, window_end_ns);
    if (!busy.empty() && begin <= busy.back().end) {
      busy.back().end = std::max(busy.back().end, end);
    } else {
      busy.push_back({begin, end, i});
    }
  }
  auto seconds = [](std::uint64_t a, std::uint64_t b) { return static_cast<double>(b - a) * 1e-9; };
  if (busy.empty()) {
    out.before_first_seconds = out.idle_seconds = out.window_seconds;
    return out;
  }
  out.before_first_seconds = seconds(window_start_ns, busy.front().begin);
  std::uint64_t first_range = busy.front().begin;
  for (TraceEvent const& e : events) {
    if (!e.kernel) first_range = std::min(first_range, std::max(e.start_ns, window_start_ns));
  }
  out.before_first_host_seconds = seconds(window_start_ns, first_range);
  std::vector<TraceEvent> before;  // the CPU ranges clipped to [window start, first activity)
  for (TraceEvent const& e : events) {
    if (e.kernel || e.end_ns <= window_start_ns || e.start_ns >= busy.front().begin) continue;
    TraceEvent clipped = e;
    clipped.start_ns = std::max(e.start_ns, window_start_ns);
    clipped.end_ns = std::min(e.end_ns, busy.front().begin);
    before.push_back(std::move(clipped));
  }
  out.before_first_host = host_self_time(before, most);
  out.after_last_seconds = seconds(busy.back().end, window_end_ns);

  // CPU ranges by thread in start order (parents first), and the launching op of each correlation id.
  std::map<std::uint64_t, std::vector<std::size_t>> ranges;
  std::map<std::uint64_t, std::size_t> launcher;
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (events[i].kernel) continue;
    ranges[events[i].thread].push_back(i);
    if (events[i].correlation != 0) launcher.emplace(events[i].correlation, i);
  }
  for (auto& [thread, list] : ranges) {
    std::sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) {
      TraceEvent const &x = events[a], &y = events[b];
      return std::make_tuple(x.start_ns, y.end_ns, a) < std::make_tuple(y.start_ns, x.end_ns, b);
    });
  }
  // The ranges open on `thread` at time t, outermost first (ranges on a thread nest), by a sweep per thread: the
  // stretches come in time order, so each thread's ranges are walked once.
  struct Sweep {
    std::size_t next = 0;            // the thread's first range not yet opened
    std::vector<std::size_t> stack;  // open ranges, outermost first
  };
  std::map<std::uint64_t, Sweep> sweeps;
  auto open_at = [&](std::uint64_t thread, std::uint64_t t) -> std::vector<std::size_t> const& {
    Sweep& sweep = sweeps[thread];
    std::vector<std::size_t> const& list = ranges[thread];
    for (; sweep.next < list.size() && events[list[sweep.next]].start_ns <= t; ++sweep.next) {
      std::size_t const i = list[sweep.next];
      while (!sweep.stack.empty() && events[sweep.stack.back()].end_ns <= events[i].start_ns) sweep.stack.pop_back();
      sweep.stack.push_back(i);
    }
    while (!sweep.stack.empty() && events[sweep.stack.back()].end_ns <= t) sweep.stack.pop_back();
    return sweep.stack;
  };
  std::map<std::string, NamedTime> by_host;
  for (std::size_t k = 1; k < busy.size(); ++k) {
    std::uint64_t const begin = busy[k - 1].end, end = busy[k].begin;
    double const s = seconds(begin, end);
    out.between_seconds += s;
    ++out.stretches;
    auto const op = launcher.find(events[busy[k].first].correlation);
    std::string where;
    if (op == launcher.end()) {
      where = "(launching op not recorded)";
    } else if (events[op->second].end_ns <= begin) {
      where = "(launched in time)";
    } else {
      std::vector<std::size_t> const& stack = open_at(events[op->second].thread, begin);
      where = stack.empty()                     ? std::string("(in no range)")
              : stack.size() == 1 ? events[stack.front()].name
                                  : events[stack.front()].name + " > " + events[stack.back()].name;
    }
    NamedTime& h = by_host[where];
    h.name = where;
    h.seconds += s;
    ++h.count;
  }
  out.idle_seconds = out.before_first_seconds + out.between_seconds + out.after_last_seconds;
  out.by_host = most_time(std::move(by_host), most);
  return out;
}

std::string time_attribution_text(TimeAttribution const& t, double gpu_kernel_seconds) {
  char buf[512];
  std::string out;
  if (!t.scopes.empty()) {
    out += "  GPU time by scope (ms forward + backward = total, share of kernel time; kernels):\n";
    std::size_t const shown = std::min<std::size_t>(t.scopes.size(), 16);
    for (std::size_t i = 0; i < t.scopes.size(); ++i) {
      ScopeTime const& s = t.scopes[i];
      double const total = s.forward_seconds + s.backward_seconds;
      if (i < shown) {
        std::snprintf(buf, sizeof buf, "    %-40s %9.3f + %9.3f = %9.3f  %5.1f%%  %7s\n",
                      shortened(s.scope, 40).c_str(), s.forward_seconds * 1e3, s.backward_seconds * 1e3, total * 1e3,
                      gpu_kernel_seconds > 0 ? 100.0 * total / gpu_kernel_seconds : 0.0, grouped(s.kernels).c_str());
        out += buf;
      }
    }
    if (t.scopes.size() > shown) {
      double rest = 0;
      std::int64_t kernels = 0;
      for (std::size_t i = shown; i < t.scopes.size(); ++i) {
        rest += t.scopes[i].forward_seconds + t.scopes[i].backward_seconds;
        kernels += t.scopes[i].kernels;
      }
      std::snprintf(buf, sizeof buf, "    %-40s %33.3f  %5.1f%%  %7s\n",
                    ("the other " + std::to_string(t.scopes.size() - shown) + " scopes").c_str(), rest * 1e3,
                    gpu_kernel_seconds > 0 ? 100.0 * rest / gpu_kernel_seconds : 0.0, grouped(kernels).c_str());
      out += buf;
    }
  }
  if (!t.layers.empty()) {
    out += "  per decoder layer (ms, mean over the layers of a kind; host: the CPU's time in its forward and backward, "
           "GPU: its kernels):\n";
    for (LayerTime const& l : t.layers) {
      double const n = l.layers > 0 ? static_cast<double>(l.layers) : 1.0;
      std::snprintf(buf, sizeof buf,
                    "    %-18s %3lld layers  host %8.3f + %8.3f = %8.3f   GPU %8.3f + %8.3f = %8.3f\n",
                    l.type.c_str(), static_cast<long long>(l.layers), l.forward_host_seconds * 1e3 / n,
                    l.backward_host_seconds * 1e3 / n, (l.forward_host_seconds + l.backward_host_seconds) * 1e3 / n,
                    l.forward_gpu_seconds * 1e3 / n, l.backward_gpu_seconds * 1e3 / n,
                    (l.forward_gpu_seconds + l.backward_gpu_seconds) * 1e3 / n);
      out += buf;
    }
  }
  return out;
}

namespace {

// `heading` (with its indentation) and one line per item: milliseconds, count, name; nothing for no item.
void timed_list(std::string& out, std::string const& heading, std::vector<NamedTime> const& items) {
  if (items.empty()) return;
  out += heading + "\n";
  char buf[256];
  for (NamedTime const& t : items) {
    std::snprintf(buf, sizeof buf, "    %9.3f  %6s  %s\n", t.seconds * 1e3, grouped(t.count).c_str(),
                  shortened(t.name, 96).c_str());
    out += buf;
  }
}

}  // namespace

std::string profile_text(StepProfile const& p) {
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf, "profile of step %lld (backend %s)\n", static_cast<long long>(p.step),
                p.backend.c_str());
  out += buf;
  out += "  CPU op calls:   " + grouped(p.cpu_op_calls) +
         (p.cuda_api_calls > 0 ? " (+ " + grouped(p.cuda_api_calls) + " CUDA API calls)" : std::string()) + "\n";
  out += "  GPU kernels:    " + grouped(p.gpu_kernels) + " (+ " + grouped(p.gpu_memory_ops) + " memcpy/memset)\n";
  std::snprintf(buf, sizeof buf, "  step wall time: %.3f ms (CPU side, GPU waited for)\n  GPU kernel time: %.3f ms (%.1f%% of the wall time)\n",
                p.wall_seconds * 1e3, p.gpu_kernel_seconds * 1e3,
                p.wall_seconds > 0 ? 100.0 * p.gpu_kernel_seconds / p.wall_seconds : 0.0);
  out += buf;
  GpuIdle const& idle = p.gpu_idle;
  if (idle.window_seconds > 0) {
    std::snprintf(buf, sizeof buf,
                  "  GPU idle:       %.3f ms of %.3f ms (%.1f%%; no kernel, copy or set running): %.3f before the "
                  "first GPU activity (%.3f of it before the step's first host range), %.3f after the last, %.3f in "
                  "%s stretches between\n",
                  idle.idle_seconds * 1e3, idle.window_seconds * 1e3, 100.0 * idle.idle_seconds / idle.window_seconds,
                  idle.before_first_seconds * 1e3, idle.before_first_host_seconds * 1e3, idle.after_last_seconds * 1e3,
                  idle.between_seconds * 1e3,
                  grouped(idle.stretches).c_str());
    out += buf;
    timed_list(out, "    before the first GPU activity the host ran (ms of self time, ranges):",
               idle.before_first_host);
    timed_list(out, "    the stretches between by where the host was when they began (ms, stretches):", idle.by_host);
  }
  if (p.comm_kernels > 0) {
    std::snprintf(buf, sizeof buf,
                  "  communication:  %s NCCL kernels, %.3f ms, %.1f%% of it overlapped with compute kernels (%.3f ms "
                  "exposed)\n",
                  grouped(p.comm_kernels).c_str(), p.comm_kernel_seconds * 1e3,
                  p.comm_kernel_seconds > 0 ? 100.0 * p.comm_overlapped_seconds / p.comm_kernel_seconds : 0.0,
                  (p.comm_kernel_seconds - p.comm_overlapped_seconds) * 1e3);
    out += buf;
  }
  if (p.peak_bytes >= 0) {
    auto gib = [](std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); };
    std::snprintf(buf, sizeof buf, "  GPU memory:     %.2f GiB allocated at the start, %.2f GiB at the peak of the step\n",
                  gib(p.start_bytes), gib(p.peak_bytes));
    out += buf;
  }
  out += time_attribution_text(p.time, p.gpu_kernel_seconds);
  auto list = [&](char const* title, NameCounts const& items) {
    out += std::string("  ") + title + (items.empty() ? " none\n" : "\n");
    for (auto const& [name, count] : items) {
      std::snprintf(buf, sizeof buf, "    %8s  %s\n", grouped(count).c_str(), shortened(name).c_str());
      out += buf;
    }
  };
  list("most frequent CPU ops:", p.top_cpu_ops);
  list("most frequent GPU kernels:", p.top_gpu_kernels);
  timed_list(out, "  GPU kernels with the most time (ms, launches):", p.slowest_gpu_kernels);
  timed_list(out, "  host time by name, self (ms, calls; nested ops and CUDA calls are their own rows):", p.host_self);
  list("fusepack's own kernels:", p.fusepack_kernels);
  list("fusepack ops by the implementation that ran (forward calls):", p.op_implementations);
  std::int64_t calls = 0;
  for (auto const& item : p.op_implementations) calls += item.second;
  out += "  " + (p.ops_not_on_backend == 0
                     ? "all " + grouped(calls) + " op calls ran " + p.backend
                     : "ERROR: " + grouped(p.ops_not_on_backend) + " of " + grouped(calls) + " op calls did not run " +
                           p.backend) +
         "\n";
  return out;
}

}  // namespace fusepack::train
