// fusepack-bench [op ...]: benchmarks every op (or the named ones) on the GPU and prints one table.
#include "kernels/bench/bench.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <string>

int main(int argc, char** argv) {
  using namespace fusepack::bench;
  std::map<std::string, std::function<void(Report&)>> const benches = {
      {"swiglu", bench_swiglu},       {"conv1d", bench_conv1d}, {"rmsnorm", bench_rmsnorm},
      {"gated_rmsnorm", bench_gated_rmsnorm}, {"rope", bench_rope},     {"attention", bench_attention},
      {"gated_delta", bench_gated_delta},
  };
  try {
    if (!at::hasCUDA()) {
      std::fprintf(stderr, "fusepack-bench: no CUDA device; benchmarks run only on a GPU machine\n");
      return 2;
    }
    Report report(measure_copy_gbps());
    for (auto const& [name, fn] : benches) {
      bool wanted = argc == 1;
      for (int i = 1; i < argc; ++i) wanted |= name == argv[i];
      if (!wanted) continue;
      std::printf("benchmarking %s ...\n", name.c_str());
      std::fflush(stdout);
      fn(report);
    }
    report.print();
  } catch (std::exception const& e) {
    std::fprintf(stderr, "fusepack-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
