// Device helpers shared by the conv1d forward and backward: the channel pack one thread owns, its register loads and
// stores, the example lookup in cu_seqlens, the pre-activation (one tap order, so the backward recomputes the
// forward's exact fp32 values) and SiLU with its derivative.
#pragma once

#include "kernels/common/vec.cuh"
#include "kernels/conv1d/conv1d.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fusepack::conv1d_detail {

constexpr int kThreadsC = 32;      // lanes of a warp side by side along channels: a warp reads 32 packs of one token
constexpr int kPackChannels = 4;   // channels a thread owns on the pack path: 8 bytes of bf16/fp16, 16 of fp32

// kN consecutive channels of one token, the pack a thread owns (kN = 1 on the scalar path, for C not a multiple of the
// pack or tensors not aligned to it).
template <typename T, int kN>
struct Pack {
  T v[kN];
};

// A pack as it travels between memory and registers: one word of kN·sizeof(T) bytes (16, 8 or 4) when the pack fills
// one, the pack itself (kN scalar accesses) otherwise. Kept as a word, so a predicated load does not split it into
// one register per 2-byte element.
template <typename T, int kN>
struct PackWord {
  static constexpr int kBytes = kN * static_cast<int>(sizeof(T));
  using type = std::conditional_t<
      kBytes == 16, uint4,
      std::conditional_t<kBytes == 8, uint2, std::conditional_t<kBytes == 4, unsigned, Pack<T, kN>>>>;
};
template <typename T, int kN>
using Raw = typename PackWord<T, kN>::type;

// Read-only (non-coherent path) load of one pack into registers.
template <typename T, int kN>
__device__ __forceinline__ Raw<T, kN> load_raw(T const* p) {
  if constexpr (std::is_same_v<Raw<T, kN>, Pack<T, kN>>) {
    Pack<T, kN> r;
#pragma unroll
    for (int i = 0; i < kN; ++i) r.v[i] = __ldg(p + i);
    return r;
  } else {
    return __ldg(reinterpret_cast<Raw<T, kN> const*>(p));
  }
}

// The pack widened to fp32 (exact). bf16 pairs are two bit operations on their 32-bit word.
template <typename T, int kN>
__device__ __forceinline__ void widen(Raw<T, kN> const& raw, float (&out)[kN]) {
  static_assert(sizeof(Raw<T, kN>) == kN * sizeof(T));
  if constexpr (std::is_same_v<T, __nv_bfloat16> && kN % 2 == 0) {
    unsigned u[kN / 2];
    memcpy(u, &raw, sizeof(u));
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      out[2 * i] = __uint_as_float(u[i] << 16);  // the lower address holds the lower half (little-endian)
      out[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  } else {
    Pack<T, kN> r;
    memcpy(&r, &raw, sizeof(r));
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = to_float(r.v[i]);
  }
}

// Rounds kN fp32 values once to T (round to nearest even; bf16/fp16 pairs in one cvt, the same rounding) and stores
// them as one word.
template <typename T, int kN>
__device__ __forceinline__ void store_pack(T* p, float const (&in)[kN]) {
  Pack<T, kN> r;
  if constexpr (std::is_same_v<T, __nv_bfloat16> && kN % 2 == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += 2) {
      __nv_bfloat162 const two = __floats2bfloat162_rn(in[i], in[i + 1]);
      r.v[i] = two.x;
      r.v[i + 1] = two.y;
    }
  } else if constexpr (std::is_same_v<T, __half> && kN % 2 == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += 2) {
      __half2 const two = __floats2half2_rn(in[i], in[i + 1]);
      r.v[i] = two.x;
      r.v[i + 1] = two.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) r.v[i] = from_float<T>(in[i]);
  }
  if constexpr (std::is_same_v<Raw<T, kN>, Pack<T, kN>>) {
#pragma unroll
    for (int i = 0; i < kN; ++i) p[i] = r.v[i];
  } else if constexpr (sizeof(Raw<T, kN>) == 16) {
    uint4 w;
    memcpy(&w, &r, sizeof(w));
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w));
  } else if constexpr (sizeof(Raw<T, kN>) == 8) {
    // One 8-byte store (a plain assignment was split into two 4-byte stores when the halves sat in unpaired
    // registers).
    uint2 w;
    memcpy(&w, &r, sizeof(w));
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w.x), "r"(w.y));
  } else {
    Raw<T, kN> w;
    memcpy(&w, &r, sizeof(w));
    *reinterpret_cast<Raw<T, kN>*>(p) = w;
  }
}

inline bool aligned_to(void const* p, int bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// Every part starts on a pack boundary, in its columns and in memory: a pack never straddles two parts, and packs
// load and store as words.
inline bool parts_pack_aligned(Conv1dColumnParts const& parts, int pack_channels, int pack_bytes) {
  for (int i = 0; i < parts.count; ++i) {
    if (parts.start[i] % pack_channels != 0 || !aligned_to(parts.part[i], pack_bytes)) return false;
  }
  return true;
}

// Where the pack at channel c0 of a [T, C] tensor in column parts lives: the address of its token-0 element and the
// row stride (elements) of its part. c0 < C; the pack lies in one part (parts_pack_aligned, or kN = 1).
template <typename T>
struct PartColumn {
  T* at;
  std::int64_t stride;

  __device__ __forceinline__ PartColumn(Conv1dColumnParts const& parts, std::int64_t c0) {
    int i = 0;
    while (i + 1 < parts.count && parts.start[i + 1] <= c0) ++i;
    at = static_cast<T*>(parts.part[i]) + (c0 - parts.start[i]);
    stride = parts.start[i + 1] - parts.start[i];
  }
  __device__ __forceinline__ T* row(std::int64_t t) const { return at + t * stride; }
};

// The example holding token t, 0 <= t < cu[N]: the largest n < N with cu[n] <= t (empty examples are skipped, since
// the largest such n has cu[n+1] > t). All lanes of a warp search for the same t, so the loads are broadcasts.
__device__ __forceinline__ int find_example(std::int32_t const* cu, int N, int t) {
  int lo = 0, hi = N - 1;
  while (lo < hi) {
    int const mid = (lo + hi + 1) >> 1;
    if (__ldg(cu + mid) <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The tracked example [start, end) of a thread's walk; advance() moves it forward to the example holding token t.
// Token indices are int: cu_seqlens is int32, so T < 2^31.
struct ExampleSpan {
  std::int32_t const* cu;
  int n;
  int start, end;

  __device__ __forceinline__ ExampleSpan(std::int32_t const* cu_seqlens, int N, int t)
      : cu(cu_seqlens), n(find_example(cu_seqlens, N, t)), start(__ldg(cu_seqlens + n)),
        end(__ldg(cu_seqlens + n + 1)) {}

  // Precondition: t < cu[N]. Returns true when t starts a new example (the taps' history must then be zeros).
  __device__ __forceinline__ bool advance(int t) {
    if (t < end) return false;
    do {
      ++n;
      start = end;
      end = __ldg(cu + n + 1);
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
// __expf is ex2.approx(x·log2 e) behind a subnormal-range guard (3 more instructions); the flush-to-zero form gives
// the same σ bits, since an e^{−v} below 2^−126 vanishes in 1 + e^{−v} either way.
template <typename T>
__device__ __forceinline__ float conv1d_sigmoid(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return 1.0f / (1.0f + expf(-v));
  } else {
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * -1.44269504088896341f));
    return __fdividef(1.0f, 1.0f + e);
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
    for (int j = 0; j < W; ++j) w[j][i] = c0 + i < C ? to_float(__ldg(weight + (c0 + i) * W + j)) : 0.0f;
  }
}

}  // namespace fusepack::conv1d_detail
