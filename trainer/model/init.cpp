#include "trainer/model/init.h"

#include "packing/text.h"
#include "trainer/model/init_element.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifdef FUSEPACK_WITH_CUDA_KERNELS
#include "trainer/model/init_rows.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace fusepack::model {

namespace {

using packing::shape_str;

[[noreturn]] void fail(ParameterSpec const& spec, std::string const& what) {
  throw std::invalid_argument("init_parameter_rows(" + spec.name + "): " + what);
}

void check_arguments(ParameterSpec const& spec, double initializer_range, std::int64_t row_begin,
                     at::Tensor const& out) {
  if (spec.shape.empty()) fail(spec, "the parameter has no dimensions; expected at least one to split into rows");
  if (spec.init == ParameterInit::kNormal && !(std::isfinite(initializer_range) && initializer_range > 0)) {
    fail(spec, c10::str("initializer_range must be finite and positive for a normal init; got ", initializer_range));
  }
  if (!out.defined()) fail(spec, "out is an undefined tensor");
  std::vector<std::int64_t> expected = spec.shape;
  expected[0] = out.dim() > 0 ? out.size(0) : 0;
  if (out.sizes() != c10::IntArrayRef(expected)) {
    fail(spec, "out has shape " + shape_str(out.sizes()) + "; rows of a parameter of shape " +
                   shape_str(spec.shape) + " must have shape " + shape_str(expected) + " (any number of rows)");
  }
  std::int64_t const rows = spec.shape[0];
  if (row_begin < 0 || row_begin > rows) {
    fail(spec, "row_begin is " + std::to_string(row_begin) + "; expected 0 <= row_begin <= " + std::to_string(rows) +
                   " (the parameter's rows)");
  }
  if (out.size(0) > rows - row_begin) {
    fail(spec, "rows [" + std::to_string(row_begin) + ", " + std::to_string(row_begin + out.size(0)) +
                   ") run past the parameter's " + std::to_string(rows) + " rows");
  }
  at::ScalarType const t = out.scalar_type();
  if (t != at::kDouble && t != at::kFloat && t != at::kBFloat16 && t != at::kHalf) {
    fail(spec, std::string("out is ") + c10::toString(t) + "; expected fp64, fp32, bf16 or fp16");
  }
  if (!out.is_contiguous()) fail(spec, "out must be contiguous; got strides " + shape_str(out.strides()));
  if (out.is_cuda()) {
#ifndef FUSEPACK_WITH_CUDA_KERNELS
    fail(spec, "out is on " + out.device().str() +
                   " but this build has no CUDA kernels (configure with FUSEPACK_WITH_CUDA=ON and nvcc found)");
#endif
  } else if (!out.is_cpu()) {
    fail(spec, "out is on " + out.device().str() + "; expected the CPU or a CUDA device");
  }
}

// Plain threads, as many as at::get_num_threads(): at::parallel_for runs serially in a translation unit built without
// -fopenmp (ATen's OpenMP backend lives in its headers), and fusepack's are.
template <typename T, typename Round>
void fill_cpu(T* out, std::int64_t begin, std::int64_t n, std::uint64_t key, ParameterInit init, double range,
              Round round) {
  auto fill = [=](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      out[i] = round(init_math::init_element(key, static_cast<std::uint64_t>(begin + i), init, range));
    }
  };
  // 100–200 ns an element: below 64k elements (~10 ms) a thread's start-up is not worth it.
  constexpr std::int64_t kMinPerThread = 1 << 16;
  std::int64_t const threads = std::clamp<std::int64_t>(n / kMinPerThread, 1, at::get_num_threads());
  std::int64_t const chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(fill, t * chunk, std::min(n, (t + 1) * chunk));
  fill(0, std::min(n, chunk));
  for (std::thread& th : pool) th.join();
}

}  // namespace

void init_parameter_rows(ParameterSpec const& spec, double initializer_range, std::uint64_t seed,
                         std::int64_t row_begin, at::Tensor& out) {
  check_arguments(spec, initializer_range, row_begin, out);
  std::int64_t const n = out.numel();
  if (n == 0) return;
  std::int64_t const begin = row_begin * (n / out.size(0));  // rows before the slice × elements per row
  std::uint64_t const key = init_math::parameter_key(seed, spec.name);

#ifdef FUSEPACK_WITH_CUDA_KERNELS
  if (out.is_cuda()) {
    c10::cuda::CUDAGuard guard(out.device());
    InitRowsParams p;
    p.out = out.data_ptr();
    p.begin = begin;
    p.n = n;
    p.key = key;
    p.init = spec.init;
    p.initializer_range = initializer_range;
    switch (out.scalar_type()) {
      case at::kDouble: p.dtype = InitDType::kF64; break;
      case at::kFloat: p.dtype = InitDType::kF32; break;
      case at::kBFloat16: p.dtype = InitDType::kBF16; break;
      default: p.dtype = InitDType::kF16; break;  // check_arguments admitted nothing else
    }
    run_init_rows(p, at::cuda::getCurrentCUDAStream());
    out.unsafeGetTensorImpl()->bump_version();  // written through a raw pointer: tell whoever checks the version
    return;
  }
#endif

  switch (out.scalar_type()) {
    case at::kDouble:
      fill_cpu(out.data_ptr<double>(), begin, n, key, spec.init, initializer_range, [](double v) { return v; });
      break;
    case at::kFloat:
      fill_cpu(out.data_ptr<float>(), begin, n, key, spec.init, initializer_range, init_math::round_to_float);
      break;
    case at::kBFloat16:
      fill_cpu(out.data_ptr<at::BFloat16>(), begin, n, key, spec.init, initializer_range,
               [](double v) { return at::BFloat16(init_math::round_to_bf16_bits(v), at::BFloat16::from_bits()); });
      break;
    default:
      fill_cpu(out.data_ptr<at::Half>(), begin, n, key, spec.init, initializer_range,
               [](double v) { return at::Half(init_math::round_to_fp16_bits(v), at::Half::from_bits()); });
      break;
  }
  out.unsafeGetTensorImpl()->bump_version();
}

}  // namespace fusepack::model
