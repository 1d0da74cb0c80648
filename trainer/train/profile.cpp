#include "trainer/train/profile.h"

#include "kernels/ops/op_scope.h"
#include "trainer/train/report.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

StepProfiler::StepProfiler(std::int64_t step, std::string backend, bool cuda, int cuda_device)
    : step_(step), backend_(std::move(backend)), cuda_(cuda), cuda_device_(cuda_device) {
  if (prof::isProfilerEnabledInMainThread()) {
    throw std::runtime_error("--profile-step: a PyTorch profiler is already running in this process");
  }
  // A CPU-only profile on a machine without a GPU: Kineto still probes for devices and logs "gpuGetDeviceCount failed"
  // as an ERROR; nothing is wrong (there is no GPU to count), so its logging is quietened unless the user set it.
  if (!cuda_) ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  ProfilerConfig const config(ProfilerState::KINETO);
  sync_cuda(cuda_, cuda_device_);  // nothing of earlier steps in the profiled window
  prof::prepareProfiler(config, activities(cuda_));
  prof::enableProfiler(config, activities(cuda_));
  running_ = true;
  start_ns_ = now_ns();
}

StepProfiler::~StepProfiler() {
  if (running_) {
    try {
      prof::disableProfiler();
    } catch (...) {  // already unwinding: the step's own exception is the one to report
    }
  }
}

StepProfile StepProfiler::stop() {
  if (!running_) throw std::runtime_error("StepProfiler::stop: the profiler is not running");
  sync_cuda(cuda_, cuda_device_);  // the step's kernels have finished: their records are complete
  std::uint64_t const end_ns = now_ns();
  std::unique_ptr<prof::ProfilerResult> const result = prof::disableProfiler();
  running_ = false;

  StepProfile p;
  p.step = step_;
  p.backend = backend_;
  p.wall_seconds = static_cast<double>(end_ns - start_ns_) * 1e-9;
  std::map<std::string, std::int64_t> cpu, gpu, ours, implementations;
  std::vector<std::pair<std::int64_t, std::int64_t>> comm, compute;  // kernel intervals [start, end) in ns
  std::string const scope_prefix = FUSEPACK_OP_SCOPE_PREFIX, implementation_suffix = " [" + backend_ + "]";
  for (prof::KinetoEvent const& e : result->events()) {
    std::string const name = e.name();
    if (e.deviceType() == c10::DeviceType::CPU) {
      if (e.isAsync() || e.isHiddenEvent()) continue;
      if (name.rfind(scope_prefix, 0) == 0 && name.back() == ']') {  // an op range of kernels/ops/op_scope.h
        ++implementations[name.substr(scope_prefix.size())];
        bool const on_backend = name.size() >= implementation_suffix.size() &&
                                name.compare(name.size() - implementation_suffix.size(), std::string::npos,
                                             implementation_suffix) == 0;
        if (!on_backend) ++p.ops_not_on_backend;
        continue;
      }
      ++p.cpu_op_calls;
      ++cpu[name];
    } else if (e.deviceType() == c10::DeviceType::CUDA) {
      if (is_memory_activity(name)) {
        ++p.gpu_memory_ops;
        continue;
      }
      ++p.gpu_kernels;
      ++gpu[name];
      p.gpu_kernel_seconds += static_cast<double>(e.durationNs()) * 1e-9;
      std::pair<std::int64_t, std::int64_t> const span{static_cast<std::int64_t>(e.startNs()),
                                                       static_cast<std::int64_t>(e.startNs() + e.durationNs())};
      (name.rfind("nccl", 0) == 0 ? comm : compute).push_back(span);
      if (name.find("fusepack::") != std::string::npos) ++ours[name];
    }
  }
  p.comm_kernels = static_cast<std::int64_t>(comm.size());
  std::tie(p.comm_kernel_seconds, p.comm_overlapped_seconds) = overlap(comm, std::move(compute));
  p.top_cpu_ops = most_frequent(cpu, 10);
  p.top_gpu_kernels = most_frequent(gpu, 10);
  p.fusepack_kernels = most_frequent(ours, ours.size());
  p.op_implementations = most_frequent(implementations, implementations.size());
  return p;
}

std::string profile_text(StepProfile const& p) {
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf, "profile of step %lld (backend %s)\n", static_cast<long long>(p.step),
                p.backend.c_str());
  out += buf;
  out += "  CPU op calls:   " + grouped(p.cpu_op_calls) + "\n";
  out += "  GPU kernels:    " + grouped(p.gpu_kernels) + " (+ " + grouped(p.gpu_memory_ops) + " memcpy/memset)\n";
  std::snprintf(buf, sizeof buf, "  step wall time: %.3f ms (CPU side, GPU waited for)\n  GPU kernel time: %.3f ms (%.1f%% of the wall time)\n",
                p.wall_seconds * 1e3, p.gpu_kernel_seconds * 1e3,
                p.wall_seconds > 0 ? 100.0 * p.gpu_kernel_seconds / p.wall_seconds : 0.0);
  out += buf;
  if (p.comm_kernels > 0) {
    std::snprintf(buf, sizeof buf,
                  "  communication:  %s NCCL kernels, %.3f ms, %.1f%% of it overlapped with compute kernels (%.3f ms "
                  "exposed)\n",
                  grouped(p.comm_kernels).c_str(), p.comm_kernel_seconds * 1e3,
                  p.comm_kernel_seconds > 0 ? 100.0 * p.comm_overlapped_seconds / p.comm_kernel_seconds : 0.0,
                  (p.comm_kernel_seconds - p.comm_overlapped_seconds) * 1e3);
    out += buf;
  }
  auto list = [&](char const* title, NameCounts const& items) {
    out += std::string("  ") + title + (items.empty() ? " none\n" : "\n");
    for (auto const& [name, count] : items) {
      std::snprintf(buf, sizeof buf, "    %8s  %s\n", grouped(count).c_str(), shortened(name).c_str());
      out += buf;
    }
  };
  list("most frequent CPU ops:", p.top_cpu_ops);
  list("most frequent GPU kernels:", p.top_gpu_kernels);
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
