// Device helpers shared by the conv1d forward and backward: the channel pack one thread owns, the example lookup in
// cu_seqlens, the pre-activation (one tap order, so the backward recomputes the forward's exact fp32 values) and
// SiLU with its derivative.
#pragma once

#include "kernels/common/vec.cuh"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace fusepack::conv1d_detail {

constexpr int kThreadsC = 32;  // lanes of a warp side by side along channels: a warp reads 32 packs of one token

// kN consecutive channels of one token, the pack a thread owns (kN = 1 on the scalar path, for C not a multiple of the
// pack or tensors not aligned to it).
template <typename T, int kN>
struct Pack {
  T v[kN];
};

// One access of kN·sizeof(T) bytes (16, 8 or 4) when the pack fills such a word, kN scalar accesses otherwise.
template <typename T, int kN>
struct PackWord {
  static constexpr int kBytes = kN * static_cast<int>(sizeof(T));
  using type = std::conditional_t<kBytes == 16, int4,
                                  std::conditional_t<kBytes == 8, int2, std::conditional_t<kBytes == 4, int, void>>>;
};

template <typename T, int kN>
__device__ __forceinline__ Pack<T, kN> load_raw(T const* p) {
  using Word = typename PackWord<T, kN>::type;
  Pack<T, kN> r;
  if constexpr (!std::is_void_v<Word>) {
    Word const w = __ldg(reinterpret_cast<Word const*>(p));
    static_assert(sizeof(Word) == sizeof(Pack<T, kN>));
    memcpy(&r, &w, sizeof(Word));
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) r.v[i] = p[i];
  }
  return r;
}

template <typename T, int kN>
__device__ __forceinline__ void store_pack(T* p, float const (&in)[kN]) {
  using Word = typename PackWord<T, kN>::type;
  Pack<T, kN> r;
#pragma unroll
  for (int i = 0; i < kN; ++i) r.v[i] = from_float<T>(in[i]);
  if constexpr (!std::is_void_v<Word>) {
    Word w;
    memcpy(&w, &r, sizeof(Word));
    *reinterpret_cast<Word*>(p) = w;
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) p[i] = r.v[i];
  }
}

// Asynchronous 16-byte global → shared copies (sm_80+), bypassing L1. Each thread copies into its own shared slots
// and reads back only those, so waiting on its own groups is all the ordering needed (no block barrier).
__device__ __forceinline__ void cp_async16(void* smem, void const* gmem) {
  auto const addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

template <typename T, int kN>
__device__ __forceinline__ Pack<T, kN> load_shared(int4 const* slot) {
  static_assert(sizeof(Pack<T, kN>) == sizeof(int4));
  int4 const w = *slot;
  Pack<T, kN> r;
  memcpy(&r, &w, sizeof(w));
  return r;
}

inline bool aligned_to(void const* p, int bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// The example holding token t, 0 <= t < cu[N]: the largest n < N with cu[n] <= t (empty examples are skipped, since
// the largest such n has cu[n+1] > t). All lanes of a warp search for the same t, so the loads are broadcasts.
__device__ __forceinline__ int find_example(std::int32_t const* cu, int N, std::int64_t t) {
  int lo = 0, hi = N - 1;
  while (lo < hi) {
    int const mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The tracked example [start, end) of a thread's walk; advance() moves it forward to the example holding token t.
struct ExampleSpan {
  std::int32_t const* cu;
  int n;
  std::int64_t start, end;

  __device__ __forceinline__ ExampleSpan(std::int32_t const* cu_seqlens, int N, std::int64_t t)
      : cu(cu_seqlens), n(find_example(cu_seqlens, N, t)), start(cu_seqlens[n]), end(cu_seqlens[n + 1]) {}

  // Precondition: t < cu[N]. Returns true when t starts a new example (the taps' history must then be zeros).
  __device__ __forceinline__ bool advance(std::int64_t t) {
    if (t < end) return false;
    do {
      ++n;
      start = end;
      end = cu[n + 1];
    } while (end <= t);
    return true;
  }
};

// pre[i] = Σ_j weight[j][i] · tap_j[i], taps oldest first: tap j < W−1 is hist[j], tap W−1 is the current token.
// fp32, in this order in the forward and in the backward's recomputation alike.
template <int W, int kN>
__device__ __forceinline__ void pre_activation(float const (&w)[W][kN], float const (&hist)[W - 1][kN],
                                               float const (&cur)[kN], float (&pre)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    float acc = w[0][i] * hist[0][i];
#pragma unroll
    for (int j = 1; j < W - 1; ++j) acc = fmaf(w[j][i], hist[j][i], acc);
    pre[i] = fmaf(w[W - 1][i], cur[i], acc);
  }
}

// σ(v). fp32 tensors get expf and an IEEE division, as ATen's silu does; bf16/fp16 get __expf and __fdividef,
// whose few-ulp fp32 error is ~1/1000 of the output's rounding step (1 + e^{−v} ∈ [1, inf]; both give 0 at inf).
template <typename T>
__device__ __forceinline__ float conv1d_sigmoid(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return 1.0f / (1.0f + expf(-v));
  } else {
    return __fdividef(1.0f, 1.0f + __expf(-v));
  }
}

// silu'(v) = σ(v)·(1 + v·(1 − σ(v))).
template <typename T>
__device__ __forceinline__ float silu_grad(float v) {
  float const s = conv1d_sigmoid<T>(v);
  return s * fmaf(v, 1.0f - s, 1.0f);
}

// weight[c0 + i, j] for the kN channels a thread owns (zeros past C): [C, W] is channel-major.
template <typename T, int W, int kN>
__device__ __forceinline__ void load_weight(T const* weight, std::int64_t C, std::int64_t c0, float (&w)[W][kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int j = 0; j < W; ++j) w[j][i] = c0 + i < C ? to_float(weight[(c0 + i) * W + j]) : 0.0f;
  }
}

}  // namespace fusepack::conv1d_detail

// Width W (a run-time int) → compile-time constant NAME; the fused kernels cover W = 2, 3, 4.
#define FUSEPACK_CONV1D_WIDTH_SWITCH(width, NAME, ...)                                                   \
  [&] {                                                                                                  \
    switch (width) {                                                                                     \
      case 2: {                                                                                          \
        constexpr static int NAME = 2;                                                                   \
        return __VA_ARGS__();                                                                            \
      }                                                                                                  \
      case 3: {                                                                                          \
        constexpr static int NAME = 3;                                                                   \
        return __VA_ARGS__();                                                                            \
      }                                                                                                  \
      case 4: {                                                                                          \
        constexpr static int NAME = 4;                                                                   \
        return __VA_ARGS__();                                                                            \
      }                                                                                                  \
    }                                                                                                    \
    throw std::invalid_argument("conv1d: the fused kernels support width W in 2..4; got W=" +           \
                                std::to_string(width));                                                  \
  }()
