// The one kernel behind rope's forward (rotate by +a) and backward (rotate by −a), shared by rope_fwd.cu and
// rope_bwd.cu. A block owns `tokens_per_block` consecutive tokens: it first computes their cos/sin in fp64 into shared
// memory (once per token and frequency, shared by all heads), then streams the tokens' [H, D] rows with 16-byte
// vectors: a thread either rotates one pair of vectors (i, i + r/2) or copies one vector of the pass-through channels.
#pragma once

#include "kernels/common/cuda_check.h"
#include "kernels/common/static_switch.h"
#include "kernels/common/vec.cuh"
#include "kernels/rope/rope.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace fusepack {

struct RopeRotateArgs {
  void const* in = nullptr;  // [T, H, D] contiguous
  void* out = nullptr;       // [T, H, D] contiguous
  RopeDims dims;
  int tokens_per_block = 1;
};

inline constexpr int kRopeThreads = 256;

// kN elements of T: a 16-byte vector (Vec16) when kN·sizeof(T) == 16, else one element.
template <typename T>
struct RopeScalar {
  static constexpr int kN = 1;
  T v[1];
};
template <typename T, int kN>
using RopePack = std::conditional_t<kN * sizeof(T) == 16, Vec16<T>, RopeScalar<T>>;

template <typename T, int kN>
__device__ __forceinline__ RopePack<T, kN> rope_load(T const* p) {
  if constexpr (kN * sizeof(T) == 16) {
    return load16(p);
  } else {
    static_assert(kN == 1, "rope: a pack is a 16-byte vector or one element");
    return RopeScalar<T>{{*p}};
  }
}

template <typename T, int kN>
__device__ __forceinline__ void rope_store(T* p, RopePack<T, kN> const& r) {
  if constexpr (kN * sizeof(T) == 16) {
    store16(p, r);
  } else {
    *p = r.v[0];
  }
}

// A 16-byte copy. Written as `*(int4*)dst = __ldg((int4 const*)src)` nvcc 13.0 splits the store into four 4-byte
// stores in this kernel (seen in the PTX), so the store is spelled out.
__device__ __forceinline__ void rope_copy16(void* dst, void const* src) {
  int4 const v = __ldg(static_cast<int4 const*>(src));
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// kN = 16/sizeof(T) on the vector path (D and rotary_dim/2 multiples of kN, pointers 16-byte aligned), 1 otherwise.
template <typename T, int kN, bool kInverse>
__global__ void __launch_bounds__(kRopeThreads) rope_rotate_half_split(RopeRotateArgs a) {
  extern __shared__ float2 rope_cos_sin[];  // [tokens_per_block, rotary_dim/2] (cos a, ±sin a)
  auto const* in = static_cast<T const*>(a.in);
  auto* out = static_cast<T*>(a.out);
  RopeDims const& d = a.dims;
  int const half = static_cast<int>(d.rotary_dim / 2), H = static_cast<int>(d.H);
  std::int64_t const t0 = std::int64_t(blockIdx.x) * a.tokens_per_block;
  int const tokens = static_cast<int>(d.T - t0 < a.tokens_per_block ? d.T - t0 : a.tokens_per_block);

  // fp64 angle and sincos: pos·inv_freq reaches 1e5 rad, where an fp32 angle is off by ~1e-2.
  for (int idx = threadIdx.x; idx < tokens * half; idx += blockDim.x) {
    int const tt = idx / half, i = idx - tt * half;
    double const inv_freq = pow(d.theta, -2.0 * static_cast<double>(i) / static_cast<double>(d.rotary_dim));
    double s, c;
    sincos(static_cast<double>(d.position_ids[t0 + tt]) * inv_freq, &s, &c);
    rope_cos_sin[idx] = make_float2(static_cast<float>(c), static_cast<float>(kInverse ? -s : s));
  }
  __syncthreads();

  int const rot_units = half / kN;  // vector pairs (i, i + half) per head
  int const units_per_head = rot_units + static_cast<int>(d.D - d.rotary_dim) / kN;  // + pass-through vectors
  int const units_per_token = H * units_per_head;
  int const units = tokens * units_per_token;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    int const tt = u / units_per_token, r = u - tt * units_per_token;
    int const h = r / units_per_head, j = r - h * units_per_head;
    std::int64_t const row = ((t0 + tt) * H + h) * d.D;
    if (j < rot_units) {
      int const i0 = j * kN;
      RopePack<T, kN> const x1 = rope_load<T, kN>(in + row + i0), x2 = rope_load<T, kN>(in + row + i0 + half);
      float2 const* cs = rope_cos_sin + tt * half + i0;
      RopePack<T, kN> y1, y2;
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        float const c = cs[e].x, s = cs[e].y, a1 = to_float(x1.v[e]), a2 = to_float(x2.v[e]);
        y1.v[e] = from_float<T>(a1 * c - a2 * s);
        y2.v[e] = from_float<T>(a2 * c + a1 * s);
      }
      rope_store<T, kN>(out + row + i0, y1);
      rope_store<T, kN>(out + row + i0 + half, y2);
    } else {
      std::int64_t const c0 = row + d.rotary_dim + std::int64_t(j - rot_units) * kN;
      if constexpr (kN * sizeof(T) == 16) {
        rope_copy16(out + c0, in + c0);
      } else {
        out[c0] = in[c0];
      }
    }
  }
}

// Tokens per block: enough to give each thread ~8 units of work (a head of Qwen3.5 is 28 bf16 units), no more than
// the cos/sin table allows in 48 KB of shared memory.
template <bool kInverse>
void launch_rope_rotate(RopeRotateArgs a, cudaStream_t stream) {
  RopeDims const& d = a.dims;
  if (d.T == 0 || d.H == 0) return;
  std::int64_t const half = d.rotary_dim / 2;
  FUSEPACK_DTYPE_SWITCH(d.dtype, T, [&] {
    constexpr int kVecN = Vec16<T>::kN;
    bool const vec = aligned16(a.in) && aligned16(a.out) && d.D % kVecN == 0 && half % kVecN == 0;
    FUSEPACK_BOOL_SWITCH(vec, kVec, [&] {
      constexpr int kN = kVec ? kVecN : 1;
      std::int64_t const units_per_token = d.H * (half / kN + (d.D - d.rotary_dim) / kN);
      std::int64_t const max_tokens_smem =
          std::max<std::int64_t>(1, (48 << 10) / (half * std::int64_t(sizeof(float2))));
      std::int64_t tokens = (8 * kRopeThreads + units_per_token - 1) / units_per_token;
      tokens = std::max<std::int64_t>(1, std::min({tokens, max_tokens_smem, std::int64_t(64), d.T}));
      a.tokens_per_block = static_cast<int>(tokens);
      std::int64_t const blocks = (d.T + tokens - 1) / tokens;
      std::size_t const smem = static_cast<std::size_t>(tokens * half) * sizeof(float2);
      rope_rotate_half_split<T, kN, kInverse><<<static_cast<unsigned>(blocks), kRopeThreads, smem, stream>>>(a);
      FUSEPACK_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace fusepack
