#include "kernels/optim/adamw.h"

#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/common/vec.cuh"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace fusepack {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 4096;          // elements per block: a tensor is cut into ceil(numel / kChunk) blocks
constexpr int kTensorsPerLaunch = 40;  // the table travels as a kernel argument (under the 4 KiB limit)

// The step's constants, in fp64 (rounded to the master dtype once, in the kernel).
struct Constants {
  double grad_scale, decay, one_minus_beta1, beta2, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
};

struct Table {
  AdamWTensor tensor[kTensorsPerLaunch];
  std::int64_t first_block[kTensorsPerLaunch + 1];  // blocks of tensor i: [first_block[i], first_block[i + 1])
  bool vec[kTensorsPerLaunch];                        // p, g, m, v 16-byte aligned, the copy to its vector
  int count;
};

static_assert(sizeof(Table) + sizeof(Constants) <= 4096, "the kernel's arguments must fit in 4 KiB");

// Products that must round on their own (the clipped gradient equals a separate scaling's to the bit).
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

template <typename C>
__device__ __forceinline__ C round_to(float x) { return from_float<C>(x); }
template <typename C>
__device__ __forceinline__ C round_to(double x) {
  if constexpr (std::is_same_v<C, float>) return static_cast<float>(x);
  else return from_float<C>(static_cast<float>(x));  // through fp32, as ATen's copy
}

// kN copy elements in one access (8 bytes for bf16 from fp32: 4 of them).
template <typename C, int kN>
struct alignas(sizeof(C) * kN) CopyVec {
  C v[kN];
};

template <typename T>
struct Element {
  T p, g, m, v;
};

template <typename T>
__device__ __forceinline__ void update(Element<T>& e, Constants const& k) {
  T const g = mul_rn(e.g, T(k.grad_scale));
  T const p = e.p * T(k.decay);
  e.m = e.m + T(k.one_minus_beta1) * (g - e.m);
  e.v = T(k.beta2) * e.v + T(k.one_minus_beta2) * (g * g);
  T const denom = sqrt(e.v) / T(k.bias_correction2_sqrt) + T(k.eps);
  e.p = p - T(k.step_size) * (e.m / denom);
}

template <typename T, typename C>
__global__ void __launch_bounds__(kThreads) adamw_update(Table const table, Constants const k) {
  // The tensor this block belongs to: the last whose first block is <= blockIdx.x.
  int lo = 0, hi = table.count - 1;
  std::int64_t const block = blockIdx.x;
  while (lo < hi) {
    int const mid = (lo + hi + 1) / 2;
    if (table.first_block[mid] <= block) lo = mid;
    else hi = mid - 1;
  }
  AdamWTensor const& t = table.tensor[lo];
  std::int64_t const begin = (block - table.first_block[lo]) * kChunk;
  std::int64_t const end = begin + kChunk < t.numel ? begin + kChunk : t.numel;
  T* const param = static_cast<T*>(t.param);
  T const* const grad = static_cast<T const*>(t.grad);
  T* const exp_avg = static_cast<T*>(t.exp_avg);
  T* const exp_avg_sq = static_cast<T*>(t.exp_avg_sq);
  C* const copy = static_cast<C*>(t.copy);
  constexpr int kN = Vec16<T>::kN;
  if (table.vec[lo] && end - begin == kChunk) {
#pragma unroll 4
    for (std::int64_t i = begin + std::int64_t(threadIdx.x) * kN; i < end; i += kThreads * kN) {
      Vec16<T> p = load16(param + i), g = load16(grad + i), m = load16(exp_avg + i), v = load16(exp_avg_sq + i);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        Element<T> e{p.v[j], g.v[j], m.v[j], v.v[j]};
        update(e, k);
        p.v[j] = e.p;
        m.v[j] = e.m;
        v.v[j] = e.v;
      }
      store16(param + i, p);
      store16(exp_avg + i, m);
      store16(exp_avg_sq + i, v);
      if (copy != nullptr) {
        CopyVec<C, kN> c;
#pragma unroll
        for (int j = 0; j < kN; ++j) c.v[j] = round_to<C>(p.v[j]);
        *reinterpret_cast<CopyVec<C, kN>*>(copy + i) = c;
      }
    }
    return;
  }
  for (std::int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    Element<T> e{param[i], grad[i], exp_avg[i], exp_avg_sq[i]};
    update(e, k);
    param[i] = e.p;
    exp_avg[i] = e.m;
    exp_avg_sq[i] = e.v;
    if (copy != nullptr) copy[i] = round_to<C>(e.p);
  }
}

template <typename T, typename C>
void launch(AdamWUpdateParams const& u, Constants const& k, cudaStream_t stream) {
  std::size_t next = 0;
  while (next < u.tensors.size()) {
    Table table{};
    std::int64_t blocks = 0;
    int n = 0;
    for (; next < u.tensors.size() && n < kTensorsPerLaunch; ++next) {
      AdamWTensor const& t = u.tensors[next];
      if (t.numel == 0) continue;
      std::int64_t const b = (t.numel + kChunk - 1) / kChunk;
      if (n > 0 && blocks + b > std::int64_t{0x7fffffff}) break;  // the grid's x limit: the rest in the next launch
      table.tensor[n] = t;
      table.first_block[n] = blocks;
      table.vec[n] = aligned16(t.param) && aligned16(t.grad) && aligned16(t.exp_avg) && aligned16(t.exp_avg_sq) &&
                     (t.copy == nullptr ||
                      reinterpret_cast<std::uintptr_t>(t.copy) % sizeof(CopyVec<C, Vec16<T>::kN>) == 0);
      blocks += b;
      ++n;
    }
    if (n == 0) continue;
    table.first_block[n] = blocks;
    table.count = n;
    adamw_update<T, C><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table, k);
    FUSEPACK_CUDA_CHECK_LAUNCH();
  }
}

void check(AdamWUpdateParams const& u) {
  auto fail = [](std::string const& what) { throw std::invalid_argument("run_adamw_update: " + what); };
  if (!(u.step >= 1)) fail("step must be >= 1 (the count after the increment); got " + std::to_string(u.step));
  if (!(u.beta1 >= 0 && u.beta1 < 1 && u.beta2 >= 0 && u.beta2 < 1)) fail("betas must be in [0, 1)");
  if (!(std::isfinite(u.lr) && std::isfinite(u.grad_scale) && std::isfinite(u.eps) && std::isfinite(u.weight_decay)))
    fail("lr, grad_scale, eps and weight_decay must be finite");
  for (std::size_t i = 0; i < u.tensors.size(); ++i) {
    AdamWTensor const& t = u.tensors[i];
    if (t.numel < 0) fail("tensor " + std::to_string(i) + " has numel " + std::to_string(t.numel));
    if (t.numel > 0 && !(t.param && t.grad && t.exp_avg && t.exp_avg_sq))
      fail("tensor " + std::to_string(i) + " lacks one of p, g, m, v");
  }
}

}  // namespace

void run_adamw_update(AdamWUpdateParams const& u, cudaStream_t stream) {
  check(u);
  double const bias_correction1 = 1 - std::pow(u.beta1, static_cast<double>(u.step));
  double const bias_correction2 = 1 - std::pow(u.beta2, static_cast<double>(u.step));
  Constants const k{u.grad_scale,       1 - u.lr * u.weight_decay, 1 - u.beta1,
                    u.beta2,            1 - u.beta2,               u.lr / bias_correction1,
                    std::sqrt(bias_correction2), u.eps};
  FUSEPACK_DTYPE_SWITCH(u.copy_dtype, C, [&] {
    if (u.fp64) launch<double, C>(u, k, stream);
    else launch<float, C>(u, k, stream);
  });
}

}  // namespace fusepack
