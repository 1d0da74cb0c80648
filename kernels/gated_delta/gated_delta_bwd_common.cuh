// Device helpers shared by the stages of the gated delta rule backward (gated_delta_bwd_intra.cuh, _state.cuh and
// _chunk.cuh, which gated_delta_bwd.cu runs in that order): the per-chunk kernels' block shape; warp_mma, their
// products in fp32 runs (fp64 FMAs rounded once to fp32); the warp sums; chunk_cumsum, the fp64 in-chunk cumulative
// sum of g that the stages recompute (they also run the sums that make dg and dβ in fp64); block-wide tile loads into
// fp32 shared memory. The other products, of 16-bit runs and of the recurrence, are gated_delta_mma.cuh's.
#pragma once

#include "kernels/common/vec.cuh"
#include "kernels/gated_delta/gated_delta.h"
#include "kernels/gated_delta/gated_delta_mma.cuh"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fusepack::gated_delta_bwd_detail {

using namespace gated_delta_mma;

constexpr int kChunk = kGatedDeltaChunk;  // 64 tokens: 4 row tiles of 16
constexpr int kWarps = 8;                 // of gated_delta_bwd_intra and gated_delta_bwd_chunk
constexpr int kThreads = 32 * kWarps;

#if defined(__CUDACC__)
__device__ __forceinline__ float* shared_floats() {
  extern __shared__ float4 gated_delta_bwd_smem[];
  return reinterpret_cast<float*>(gated_delta_bwd_smem);
}
#endif

// The products of fp32 runs (the accuracy path, not the speed path; judged against the fp32 composite's cuBLAS GEMMs
// with a floor of one fp32 rounding step): one warp, acc[i][j] += Σ_{k < kK} a(r, k) · b(k, c) on the 16×8 tiles at
// rows m0 + 16·i, columns n0 + nstep·j, each tile's sum over k in fp64 FMAs and added to the fp32 accumulator with one
// rounding. (3xTF32 keeps 22 of fp32's 24 mantissa bits per operand and missed that budget 3-7x on the H200; plain
// fp32 FMA chains over k left dk at up to 110% of it; this puts the worst fp32 gradient at 46%.) a(r, k), b(k, c)
// read shared memory in any layout (a transposed operand is just another accessor). acc[i][j][e] is the element at
// row m0 + 16·i + lane/4 + 8·(e/2), column n0 + nstep·j + 2·(lane%4) + e%2, the layout of an mma accumulator tile.
template <int kMI, int kNJ, int kK, class AAt, class BAt>
__device__ __forceinline__ void warp_mma(float (&acc)[kMI][kNJ][4], int m0, int n0, int nstep, AAt const& a,
                                         BAt const& b) {
  int const lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < kMI; ++i) {
#pragma unroll
    for (int j = 0; j < kNJ; ++j) {
      int const r = m0 + 16 * i + g, c = n0 + nstep * j + 2 * t;
      double s[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll 4
      for (int k = 0; k < kK; ++k) {
        double const a0 = a(r, k), a1 = a(r + 8, k), b0 = b(k, c), b1 = b(k, c + 1);
        s[0] = fma(a0, b0, s[0]);
        s[1] = fma(a0, b1, s[1]);
        s[2] = fma(a1, b0, s[2]);
        s[3] = fma(a1, b1, s[3]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = float(double(acc[i][j][e]) + s[e]);
    }
  }
}

template <int kMI, int kNJ>
__device__ __forceinline__ void zero(float (&acc)[kMI][kNJ][4]) {
#pragma unroll
  for (int i = 0; i < kMI; ++i) {
#pragma unroll
    for (int j = 0; j < kNJ; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    }
  }
}

// Butterfly sums (every lane ends with the same bits, whatever the order the lanes run in).
template <typename F>
__device__ __forceinline__ F sum_over_quad(F x) {  // the 4 lanes of one accumulator row
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
template <typename F>
__device__ __forceinline__ F sum_over_rows(F x) {  // the 8 lanes of one accumulator column
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}
template <typename F>
__device__ __forceinline__ F sum_over_warp(F x) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// The in-chunk cumulative sums of g in fp64, computed by one warp: lane l gets G of rows 2l and 2l + 1 (g read as 0
// past the chunk's end) and every lane G_last = G[len − 1]. Decays exp(G_i − G_j) take the difference in fp64: the
// forward's fp32 cumsum is off by ~|G|·6e-8, which near the end of a chunk (|G| ~ 40) cost dg 2e-6 of its largest
// entry, four times the error of the fp32 token-by-token recurrence (a bound for fp32 runs; 16-bit runs take P and the
// records the forward saved, computed from that fp32 cumsum: 2e-6 is ~1/2000 of a bf16 step).
struct ChunkG {
  double G[2];
  double last;
};
__device__ __forceinline__ ChunkG chunk_cumsum(float const* g, std::int64_t start, int len, int Hv, int j) {
  int const lane = threadIdx.x & 31, i0 = 2 * lane;
  double const a = i0 < len ? double(g[(start + i0) * Hv + j]) : 0.0;
  double const b = i0 + 1 < len ? double(g[(start + i0 + 1) * Hv + j]) : 0.0;
  double incl = a + b;  // inclusive prefix over lanes of the pair sums (Hillis-Steele: a fixed order)
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    double const up = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += up;
  }
  double const up = __shfl_up_sync(0xffffffffu, incl, 1);
  ChunkG r;
  r.G[0] = (lane == 0 ? 0.0 : up) + a;
  r.G[1] = r.G[0] + b;
  double const at_last = __shfl_sync(0xffffffffu, (len - 1) % 2 ? r.G[1] : r.G[0], (len - 1) / 2);
  r.last = at_last;
  return r;
}

// One warp's walk over the rows of a chunk for value head j: rows 2·lane and 2·lane + 1 get G[r] (the fp64 in-chunk
// cumsum, to shared memory) and then row(r, in = r < len, token t = start + r, G_r, G_last).
template <class Row>
__device__ __forceinline__ void for_chunk_rows(GatedDeltaBwdParams const& p, int start, int len, int j, double* G,
                                               Row const& row) {
  ChunkG const cg = chunk_cumsum(p.g, start, len, p.Hv, j);
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    int const r = 2 * (threadIdx.x & 31) + h2;
    G[r] = cg.G[h2];
    row(r, r < len, std::int64_t(start) + r, cg.G[h2], cg.last);
  }
}

// Four consecutive elements widened to fp32, in one 16-byte (fp32) or 8-byte (bf16, fp16) access.
__device__ __forceinline__ void load4(float const* s, float (&x)[4]) {
  float4 const v = *reinterpret_cast<float4 const*>(s);
  x[0] = v.x;
  x[1] = v.y;
  x[2] = v.z;
  x[3] = v.w;
}
template <typename T>
__device__ __forceinline__ void load4(T const* s, float (&x)[4]) {
  uint2 const v = *reinterpret_cast<uint2 const*>(s);
  T h[4];
  memcpy(h, &v, sizeof(v));
#pragma unroll
  for (int e = 0; e < 4; ++e) x[e] = to_float(h[e]);
}

// dst[r·pitch + c] = scale(r) · src[r·stride + c] for r < rows_valid and c < cols_valid, 0 elsewhere in the
// rows × cols tile (cols a multiple of 4). The whole block takes part; 4 elements per access when src and stride
// are aligned to them (one uniform branch), else scalar loads.
template <typename T, class Scale>
__device__ __forceinline__ void load_tile(float* dst, int pitch, T const* src, std::int64_t stride, int rows, int cols,
                                          int rows_valid, int cols_valid, Scale const& scale) {
  bool const vec = rows_valid > 0 && reinterpret_cast<std::uintptr_t>(src) % (4 * sizeof(T)) == 0 && stride % 4 == 0;
  int const groups = cols / 4;
  for (int idx = threadIdx.x; idx < rows * groups; idx += kThreads) {
    int const r = idx / groups, c = (idx - r * groups) * 4;
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (r < rows_valid) {
      T const* s = src + r * stride + c;
      if (vec) {
        load4(s, x);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = to_float(s[e]);
      }
      float const f = scale(r);
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = c + e < cols_valid ? f * x[e] : 0.0f;
    }
    *reinterpret_cast<float4*>(dst + r * pitch + c) = make_float4(x[0], x[1], x[2], x[3]);
  }
}

// load_tile's row scale that leaves the rows as they are.
struct Unit {
  __device__ float operator()(int) const { return 1.0f; }
};

}  // namespace fusepack::gated_delta_bwd_detail
