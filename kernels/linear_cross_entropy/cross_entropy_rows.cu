#include "kernels/linear_cross_entropy/cross_entropy_rows.h"

#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/common/vec.cuh"

#include <cmath>
#include <limits>

namespace fusepack {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kIgnoreIndex = -100;

// A running (max, Σ exp(x − max)) pair: the online softmax denominator. An empty pair is (−inf, 0).
struct MaxSum {
  float m = -INFINITY;
  float s = 0.f;
  __device__ void add(float x) {
    if (x > m) {
      s = s * expf(m - x) + 1.f;
      m = x;
    } else {
      s += expf(x - m);  // a NaN logit fails `x > m` and lands here: s becomes NaN
    }
  }
  __device__ void merge(MaxSum o) {
    float const mm = fmaxf(m, o.m);
    if (mm == -INFINITY) return;  // both empty
    s = (m == -INFINITY ? 0.f : s * expf(m - mm)) + (o.m == -INFINITY ? 0.f : o.s * expf(o.m - mm));
    m = mm;
  }
};

// Plain loads (not the read-only path): the second pass writes the memory the first one read.
template <typename T>
__device__ __forceinline__ Vec16<T> load_vec(T const* p) {
  Vec16<T> r;
  *reinterpret_cast<int4*>(&r) = *reinterpret_cast<int4 const*>(p);
  return r;
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) cross_entropy_rows(CrossEntropyRowsParams p) {
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  std::int64_t const V = p.vocab;
  T* z = static_cast<T*>(p.logits) + static_cast<std::int64_t>(blockIdx.x) * V;
  std::int64_t const label = p.labels[blockIdx.x];
  if (label == kIgnoreIndex) {  // no target: no loss, a zero gradient
    if (threadIdx.x == 0) p.loss[blockIdx.x] = 0.f;
    if (!p.gradient) return;
    for (std::int64_t i = std::int64_t(threadIdx.x) * kN; i < V; i += kThreads * kN) {
      if constexpr (kVec) {
        if (i + kN <= V) {
          Vec16<T> zero;
#pragma unroll
          for (int j = 0; j < kN; ++j) zero.v[j] = from_float<T>(0.f);
          store16(z + i, zero);
          continue;
        }
      }
      for (std::int64_t e = i; e < i + kN && e < V; ++e) z[e] = from_float<T>(0.f);
    }
    return;
  }

  // Pass 1: this thread's (max, sum) over its elements, then the block's, in a fixed order.
  MaxSum acc;
  for (std::int64_t i = std::int64_t(threadIdx.x) * kN; i < V; i += kThreads * kN) {
    if constexpr (kVec) {
      if (i + kN <= V) {
        Vec16<T> const x = load_vec(z + i);
#pragma unroll
        for (int j = 0; j < kN; ++j) acc.add(to_float(x.v[j]));
        continue;
      }
    }
    for (std::int64_t e = i; e < i + kN && e < V; ++e) acc.add(to_float(z[e]));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other;
    other.m = __shfl_xor_sync(0xffffffffu, acc.m, offset);
    other.s = __shfl_xor_sync(0xffffffffu, acc.s, offset);
    acc.merge(other);
  }
  // Plain arrays: a __shared__ MaxSum would run its member initialisers in every thread, racing the stores below.
  __shared__ float warp_max[kThreads / 32], warp_sum[kThreads / 32];
  __shared__ float row_lse;
  if (threadIdx.x % 32 == 0) {
    warp_max[threadIdx.x / 32] = acc.m;
    warp_sum[threadIdx.x / 32] = acc.s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum total;
    for (int w = 0; w < kThreads / 32; ++w) {
      MaxSum part;
      part.m = warp_max[w];
      part.s = warp_sum[w];
      total.merge(part);
    }
    bool const bad = label < 0 || label >= V;
    float const lse = bad ? NAN : total.m + logf(total.s);
    // The target's logit is read before the barrier below: after it, pass 2 overwrites the row.
    p.loss[blockIdx.x] = bad ? NAN : lse - to_float(z[label]);
    row_lse = lse;
  }
  __syncthreads();
  if (!p.gradient) return;

  // Pass 2: the gradient over the logits, in place.
  float const lse = row_lse;
  auto grad = [&](float x, std::int64_t j) { return expf(x - lse) - (j == label ? 1.f : 0.f); };
  for (std::int64_t i = std::int64_t(threadIdx.x) * kN; i < V; i += kThreads * kN) {
    if constexpr (kVec) {
      if (i + kN <= V) {
        Vec16<T> x = load_vec(z + i);
#pragma unroll
        for (int j = 0; j < kN; ++j) x.v[j] = from_float<T>(grad(to_float(x.v[j]), i + j));
        store16(z + i, x);
        continue;
      }
    }
    for (std::int64_t e = i; e < i + kN && e < V; ++e) z[e] = from_float<T>(grad(to_float(z[e]), e));
  }
}

}  // namespace

void run_cross_entropy_rows(CrossEntropyRowsParams const& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  FUSEPACK_DTYPE_SWITCH(p.dtype, T, [&] {
    // Vector accesses when every row starts on a 16-byte boundary.
    bool const vec = aligned16(p.logits) && (p.vocab * static_cast<std::int64_t>(sizeof(T))) % 16 == 0;
    FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
      cross_entropy_rows<T, kVec><<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
      FUSEPACK_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace fusepack
