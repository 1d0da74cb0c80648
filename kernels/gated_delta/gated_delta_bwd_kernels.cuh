// The kernels of the chunked gated delta rule backward, in the order gated_delta_bwd.cu runs them:
//   gated_delta_bwd_intra  per (chunk, value head): P = q̂k̂ᵀ ⊙ decay (i >= j) and Â = k̂k̂ᵀ ⊙ decay (i > j), P also
//                          as split-bf16 planes, and the per-token record of row scales (fp32 runs only: the forward
//                          of 16-bit runs saves P and the records, gated_delta_saves_intra, and their per-chunk
//                          kernel forms P and Â on its own tiles);
//   gated_delta_bwd_state  per (example, value head, 16·kBWarps columns of V): the reverse chunk recurrence of dh, y,
//                          dv, each warp carrying dhᵀ of its 16 value columns in fp32 registers;
//   gated_delta_bwd_chunk  per (chunk, key head): dβ and dg of the group's value heads in head order, their dq̂ and
//   (_mma for 16-bit)      dk̂ summed in registers, then the scale and the l2norm backward: dq, dk.
// Matrix products of bf16 and fp16 runs run on the tensor cores, gated_delta_mma.cuh's split-bf16 products
// (SplitPolicy: raw bf16 exact, fp16 as two bf16 parts; fp32 intermediates as two parts, ~2^-16 relative per
// product, except in the per-chunk kernel of bf16 runs: one part, SplitPolicy::kGradParts says why). The recurrence
// runs them for fp32 runs too (three parts each, fp32 accuracy); the per-chunk kernels of
// fp32 runs run their products in fp64 FMAs, rounded once to fp32 (warp_mma). The in-chunk cumulative sums of g are
// recomputed from g in fp64 (chunk_cumsum says why) and the sums that make dg and dβ run in fp64.
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
constexpr int kSlab = 32;  // rows of h and dh_next per step of gated_delta_bwd_chunk



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

// dst[r·stride + c] = src[r·pitch + c] over a rows × cols fp32 tile (cols a multiple of 4), the whole block.
__device__ __forceinline__ void store_tile(float* dst, std::int64_t stride, float const* src, int pitch, int rows,
                                           int cols) {
  bool const vec = reinterpret_cast<std::uintptr_t>(dst) % 16 == 0 && stride % 4 == 0;
  int const groups = cols / 4;
  for (int idx = threadIdx.x; idx < rows * groups; idx += kThreads) {
    int const r = idx / groups, c = (idx - r * groups) * 4;
    float const* s = src + r * pitch + c;
    float* d = dst + r * stride + c;
    if (vec) {
      *reinterpret_cast<float4*>(d) = *reinterpret_cast<float4 const*>(s);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) d[e] = s[e];
    }
  }
}

// kSlab columns of a saved hᵀ or dh_nextᵀ [V][K] (state_tile order) held in registers between their global load and
// their shared-memory store, so that the load is in flight while the block computes on the previous slab: kPer
// float4 per thread, whole tiles, coalesced. Element x of v[u] is at row(u) + 8·(x/2), column col(u) + x%2 of the slab.
template <int V, int K>
struct StateSlab {
  static constexpr int kTiles = kSlab / 8, kPer = V * kSlab / 4 / kThreads, kVbStep = kThreads / (32 * kTiles);
  static_assert(V * kSlab / 4 % kThreads == 0 && kThreads % (32 * kTiles) == 0, "whole tiles, as many per thread");
  float4 v[kPer];

  // The thread's tile: value block vb0() + kVbStep·u, slab tile nt(); its lane's place in the tile.
  __device__ __forceinline__ static int vb0() { return int(threadIdx.x) / (32 * kTiles); }
  __device__ __forceinline__ static int nt() { return (int(threadIdx.x) / 32) % kTiles; }
  __device__ __forceinline__ static int row(int u) { return 16 * (vb0() + kVbStep * u) + (int(threadIdx.x) & 31) / 4; }
  __device__ __forceinline__ static int col(int u) { return 8 * nt() + 2 * (int(threadIdx.x) & 3); }
  // Slab sb of the state of one (chunk, value head) at `state`.
  __device__ __forceinline__ void load(float const* state, int sb) {
    float const* const base = state + state_tile(K, vb0(), sb * kTiles + nt()) + 4 * (threadIdx.x & 31);
#pragma unroll
    for (int u = 0; u < kPer; ++u) v[u] = *reinterpret_cast<float4 const*>(base + state_tile(K, kVbStep * u, 0));
  }
  // fp32 [V][pitch] (pitch even).
  __device__ __forceinline__ void store(float* dst, int pitch) const {
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      float* const at = dst + row(u) * pitch + col(u);
      *reinterpret_cast<float2*>(at) = make_float2(v[u].x, v[u].y);
      *reinterpret_cast<float2*>(at + 8 * pitch) = make_float2(v[u].z, v[u].w);
    }
  }
  // Σ this ⊙ other over the thread's elements, in fp32.
  __device__ __forceinline__ float dot(StateSlab const& other) const {
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      s += v[u].x * other.v[u].x + v[u].y * other.v[u].y + v[u].z * other.v[u].z + v[u].w * other.v[u].w;
    }
    return s;
  }
};

struct Unit {
  __device__ float operator()(int) const { return 1.0f; }
};

// Shared-memory layouts (fp32 elements). Pitches: K + 8 and 64 + 8 where the hot reads walk a column (transposed
// operands: 8 mod 32 spreads lanes (t, g) over 32 banks), V + 4 and 64 + 4 where they walk a row (4 mod 32).
template <int K>
struct IntraSmem {
  static constexpr int kLd = K + 4;
  static constexpr int G = 0;  // fp64 [64], in doubles; the rest in floats
  static constexpr int q = 2 * kChunk, k = q + kChunk * kLd, rq = k + kChunk * kLd, rk = rq + kChunk,
                       floats = rk + kChunk;
};
template <int K, int V>
struct ChunkSmem {
  static constexpr int kLdK = K + 8, kLdV = V + 4, kLdL = kChunk + 4, kLdS = kSlab + 4;
  static constexpr int kM = 2 * kChunk * kLdL, kH = 2 * V * kLdS;  // dP̃ and B; the hᵀ and dh_nextᵀ slabs [V][kLdS]
  static constexpr int region = kM > kH ? kM : kH;
  // fp64 first (8-byte aligned), in doubles: G and the partial sums of dG and dβ
  static constexpr int G = 0, rowE = G + kChunk, rowF = rowE + 2 * kChunk, colE = rowF + 2 * kChunk,
                       rowS = colE + 4 * kChunk, rowB = rowS + 2 * kChunk, dG = rowB + 2 * kChunk, last = dG + kChunk,
                       hd = last + kWarps, doubles = hd + kWarps;
  // then fp32, in floats:
  static constexpr int q = 2 * doubles, k = q + kChunk * kLdK, dout = k + kChunk * kLdK, y = dout + kChunk * kLdV,
                       v_new = y + kChunk * kLdV, R = v_new + kChunk * kLdV, beta = R + region, Gam = beta + kChunk,
                       s = Gam + kChunk, rq = s + kChunk, rk = rq + kChunk, vy = rk + kChunk, dots = vy + kChunk,
                       floats = dots + 4 * kChunk;
};

// Dynamic shared memory of each kernel (the fp64 arrays counted as two floats each).
template <int K>
constexpr std::size_t intra_smem_bytes() {
  return sizeof(float) * IntraSmem<K>::floats;
}
template <int K, int V>
constexpr std::size_t chunk_smem_bytes() {
  return sizeof(float) * ChunkSmem<K, V>::floats;
}

// The fp32 workspace: byte offsets of its regions (each 256-byte aligned) and its size.
// P_planes, A and rec for fp32 runs only: the forward of 16-bit runs saved P and rec (gated_delta_saves_intra), and
// their per-chunk kernel forms Â itself.
struct BwdWorkspace {
  std::size_t P_planes = 0;  // bf16 [NC, Hv, parts, 64, 64]: P of every chunk, split
  std::size_t A = 0;         // [NC, Hv, 64, 64] Â of every chunk
  std::size_t rec = 0;       // [T, Hv, kBwdRecord] the recurrence's row scales
  std::size_t dh = 0;        // [NC, Hv, V, K] dh_nextᵀ: the gradient of the state leaving every chunk, transposed
  std::size_t y = 0;         // [T, Hv, V] y = Ainvᵀ dv_new, fp32 or bf16 (gated_delta_handover_bytes)
  std::size_t bytes = 0;
};
inline BwdWorkspace bwd_workspace(GatedDeltaBwdParams const& p) {
  auto const at = [](std::size_t& offset, std::size_t floats) {
    std::size_t const begin = offset;
    offset += (floats * sizeof(float) + 255) / 256 * 256;
    return begin;
  };
  auto const size = [](std::int64_t x) { return x > 0 ? std::size_t(x) : std::size_t(0); };
  std::size_t const NC = size(p.NC), T = size(p.T), Hv = size(p.Hv), K = size(p.K), V = size(p.V);
  BwdWorkspace w;
  std::size_t o = 0;
  if (!gated_delta_saves_intra(p.dtype)) {
    w.P_planes = at(o, NC * Hv * gated_delta_ainv_parts(p.dtype) * kChunk * kChunk / 2);  // bf16 pairs
    w.A = at(o, NC * Hv * kChunk * kChunk);
    w.rec = at(o, T * Hv * kBwdRecord);
  }
  w.dh = at(o, NC * Hv * K * V);
  w.y = at(o, T * Hv * V * gated_delta_handover_bytes(p.dtype) / 4);
  w.bytes = o;
  return w;
}

// P[i, j] = (q̂_i·k̂_j) exp(G_i − G_j) for j <= i, Â[i, j] = (k̂_i·k̂_j) exp(G_i − G_j) for j < i, both 0 elsewhere
// (and on rows past the chunk's end): one [q; k] kᵀ product of the raw inputs, rstd and scale applied after. P goes
// out as planes of bf16 parts ([parts][64][64]: the recurrence's tensor-core operand; their sum in part order is P to
// ~2^-17 relative with 2 parts, exactly with 3), Â in fp32; and the chunk's records (BwdRecord).
template <typename T, int K>
__global__ void __launch_bounds__(kThreads)
    gated_delta_bwd_intra(GatedDeltaBwdParams p, __nv_bfloat16* P_planes_out, float* A_out, float* rec_out) {
  constexpr int kPF = SplitPolicy<T>::kOrder + 1;
  using S = IntraSmem<K>;
  constexpr int kLd = S::kLd;
  float* const sm = shared_floats();
  float *const q_s = sm + S::q, *const k_s = sm + S::k, *const rq = sm + S::rq, *const rk = sm + S::rk;
  double* const G = reinterpret_cast<double*>(sm) + S::G;
  int const c = blockIdx.x / p.Hv, j = blockIdx.x % p.Hv, kh = j / (p.Hv / p.Hk);
  int const start = p.chunks[c], len = p.chunks[p.NC + c];
  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  if (warp == 0) {
    for_chunk_rows(p, start, len, j, G, [&](int r, bool in, std::int64_t t, double G_r, double G_last) {
      float const r_q = in ? p.q_rstd[t * p.Hk + kh] : 0.0f, r_k = in ? p.k_rstd[t * p.Hk + kh] : 0.0f;
      rq[r] = p.scale * r_q;
      rk[r] = r_k;
      if (in) {
        float const decay = expf(float(G_r)), b = to_float(static_cast<T const*>(p.beta)[t * p.Hv + j]);
        float4* rec = reinterpret_cast<float4*>(rec_out + (t * p.Hv + j) * kBwdRecord);
        rec[0] = make_float4(p.scale * r_q * decay, expf(float(G_last - G_r)) * r_k, -r_k * b * decay, b);
        rec[1] = make_float4(expf(float(G_last)), 0.0f, 0.0f, 0.0f);
      }
    });
  }
  // Warps 0-3: rows of q (P), warps 4-7: rows of k (Â); 16 rows × 64 columns each.
  bool const is_p = warp < 4;
  float acc[1][8][4];
  zero(acc);
  std::int64_t const row0 = (std::int64_t(start) * p.Hk + kh) * K, stride = std::int64_t(p.Hk) * K;
  if constexpr (sizeof(T) == 2) {  // raw 16-bit tiles (over the fp32 tiles' space), split-bf16 products
    using Pol = SplitPolicy<T>;
    constexpr int kLdT = K + kLdPad;
    T *const q_t = reinterpret_cast<T*>(q_s), *const k_t = reinterpret_cast<T*>(k_s);
    static_assert(sizeof(T) * kLdT <= sizeof(float) * kLd, "a 16-bit row fits in an fp32 row's space");
    copy_rows_async<kChunk, int(sizeof(T)) * K, kThreads>(q_t, int(sizeof(T)) * kLdT, static_cast<T const*>(p.q) + row0,
                                                          sizeof(T) * stride, len);
    copy_rows_async<kChunk, int(sizeof(T)) * K, kThreads>(k_t, int(sizeof(T)) * kLdT, static_cast<T const*>(p.k) + row0,
                                                          sizeof(T) * stride, len);
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    T const* a_tile = is_p ? q_t : k_t;
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {
      std::uint32_t a[Pol::kRawParts][4];
      load_a_rows<T, Pol::kRawParts>(a_tile, kLdT, 16 * (warp & 3), 16 * ks, lane, a);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        std::uint32_t b0[Pol::kRawParts][2], b1[Pol::kRawParts][2];
        load_b_cols_x2<T, Pol::kRawParts>(k_t, kLdT, 16 * np, 16 * ks, lane, b0, b1);
        mma_split<Pol::kOrder>(acc[0][2 * np], a, b0);
        mma_split<Pol::kOrder>(acc[0][2 * np + 1], a, b1);
      }
    }
  } else {  // fp32: fp32 tiles, fp64 FMAs
    load_tile(q_s, kLd, static_cast<T const*>(p.q) + row0, stride, kChunk, K, len, K, Unit{});
    load_tile(k_s, kLd, static_cast<T const*>(p.k) + row0, stride, kChunk, K, len, K, Unit{});
    __syncthreads();
    float const* a_rows = (is_p ? q_s : k_s) + 16 * (warp & 3) * kLd;
    warp_mma<1, 8, K>(
        acc, 0, 0, 8, [&](int r, int kk) { return a_rows[r * kLd + kk]; },
        [&](int kk, int n) { return k_s[n * kLd + kk]; });
  }
  float* const A_c = A_out + (std::int64_t(c) * p.Hv + j) * kChunk * kChunk;
  __nv_bfloat16* const P_c = P_planes_out + (std::int64_t(c) * p.Hv + j) * kPF * kChunk * kChunk;
  float const* r_scale = is_p ? rq : rk;
#pragma unroll
  for (int jn = 0; jn < 8; ++jn) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int const i = 16 * (warp & 3) + g + 8 * half, col = 8 * jn + 2 * t4;
      float v[2];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        int const jj = col + b;
        bool const keep = i < len && (is_p ? jj <= i : jj < i);
        v[b] = keep ? r_scale[i] * rk[jj] * acc[0][jn][2 * half + b] * expf(float(G[i] - G[jj])) : 0.0f;
      }
      if (is_p) {
        std::uint32_t w[kPF];
        split_pair<kPF>(v[0], v[1], w);
#pragma unroll
        for (int part = 0; part < kPF; ++part) {
          *reinterpret_cast<std::uint32_t*>(P_c + (part * kChunk + i) * kChunk + col) = w[part];
        }
      } else {
        *reinterpret_cast<float2*>(A_c + i * kChunk + col) = make_float2(v[0], v[1]);
      }
    }
  }
}

// The recurrence's shared memory, per stage (one chunk's inputs): the raw k, q rows and the block's do columns, P and
// Ainv as bf16 planes, the records. Two stages (the next chunk streams in while this one computes) where they fit,
// one for fp32 inputs.
template <typename T, int K, int kBWarps>
struct StateSmem {
  static constexpr int kParts = SplitPolicy<T>::kOrder + 1;
  static constexpr int kStages = sizeof(T) == 4 ? 1 : 2;
  static constexpr int kBV = 16 * kBWarps;  // value columns of a block
  static constexpr int kLdK = K + kLdPad, kLdV = kBV + kLdPad;
  static constexpr std::size_t kKTile = 0;                                         // T [64][kLdK]
  static constexpr std::size_t kQTile = kKTile + sizeof(T) * kChunk * kLdK;       // T [64][kLdK]
  static constexpr std::size_t kDoTile = kQTile + sizeof(T) * kChunk * kLdK;      // T [64][kLdV]
  static constexpr std::size_t kPPlanes = align16(kDoTile + sizeof(T) * kChunk * kLdV);  // bf16 [parts][64][kLdSq]
  static constexpr std::size_t kAPlanes = kPPlanes + 2 * kParts * kPlane;        // bf16 [parts][64][kLdSq]
  static constexpr std::size_t kRec = kAPlanes + 2 * kParts * kPlane;            // fp32 [64][kBwdRecord]
  static constexpr std::size_t kStage = align16(kRec + sizeof(float) * kChunk * kBwdRecord);
  static constexpr std::size_t kBytes = kStages * kStage;
};

// The reverse chunk recurrence for example n, value head j and the block's 16·kBWarps value columns; dh starts at
// dfinal_state (or 0). Warp w carries dhᵀ of its 16 value columns [16, K] in fp32 registers as accumulator tiles and
// runs its chunk step alone (the block shares only the chunk's inputs). Per chunk, last first, in the transposed
// frame (rows: the warp's value columns; columns: the chunk's tokens i):
//   dh_next out;  dv_newᵀ = kBrSrk ⊙ (dhᵀ kᵀ) + doᵀ P;  yᵀ = dv_newᵀ Ainv;  y out, dv = β ⊙ y;
//   dhᵀ ← e^{G_last} dhᵀ + (kBrCq ⊙ do)ᵀ q + (kBrCy ⊙ y)ᵀ k,
// with the raw q, k, do as operands (exact as bf16 parts) and the row scales on the other side.
template <typename T, int K, int kBWarps>
__global__ void __launch_bounds__(kBWarps * 32, 1)
    gated_delta_bwd_state(GatedDeltaBwdParams p, __nv_bfloat16 const* P_planes, float const* rec, float* dh_out,
                          Handover<T>* y_out) {
  using Sm = StateSmem<T, K, kBWarps>;
  using Pol = SplitPolicy<T>;
  constexpr int kBThreads = kBWarps * 32, kBV = Sm::kBV, kStateTiles = K / 8;
  constexpr int kPF = Pol::kOrder + 1, kPR = Pol::kRawParts, kOrder = Pol::kOrder;
  extern __shared__ __align__(16) unsigned char gd_state_smem[];

  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  int const Hk = p.Hk, Hv = p.Hv, V = p.V, tiles = V / kBV;
  std::int64_t bid = blockIdx.x;
  int const vtile = static_cast<int>(bid % tiles);
  bid /= tiles;
  int const j = static_cast<int>(bid % Hv);
  int const n = static_cast<int>(bid / Hv);
  int const kh = j / (Hv / Hk);
  int const v0 = vtile * kBV, wc = 16 * warp;  // the block's and the warp's first value column
  int const c_first = p.chunks[3 * p.NC + n], c_end = p.chunks[3 * p.NC + n + 1];
  std::int64_t const bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];  // chunk c starts at bos + 64·(c − c_first)
  auto const* k = static_cast<T const*>(p.k);
  auto const* q = static_cast<T const*>(p.q);
  auto const* dout = static_cast<T const*>(p.dout);
  auto* dv = static_cast<T*>(p.dv);
  auto const* A_planes = reinterpret_cast<__nv_bfloat16 const*>(p.Ainv);

  // dhᵀ[v0 + wc + g + 8·(e>>1)][8·nt + 2t + (e&1)] in dh[nt][e]; state tensors are [.., K, V].
  float dh[kStateTiles][4];
  std::int64_t const state_off = (std::int64_t(n) * Hv + j) * K * V + v0 + wc + g;
#pragma unroll
  for (int nt = 0; nt < kStateTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int const d = 8 * nt + 2 * t + (e & 1), vr = 8 * (e >> 1);
      dh[nt][e] = p.dfinal_state != nullptr ? p.dfinal_state[state_off + std::int64_t(d) * V + vr] : 0.0f;
    }
  }

  // Chunk c into stage s: k, q rows, the block's do columns, the P and Ainv planes, the records (zeros past L).
  auto issue = [&](int c, int s) {
    unsigned char* base = gd_state_smem + s * Sm::kStage;
    std::int64_t const t0 = bos + std::int64_t(c - c_first) * kChunk;
    int const L = static_cast<int>(eos - t0 < kChunk ? eos - t0 : kChunk);
    constexpr int kRowT = int(sizeof(T)) * K, kLdT = int(sizeof(T)) * Sm::kLdK;
    copy_rows_async<kChunk, kRowT, kBThreads>(base + Sm::kKTile, kLdT, k + (t0 * Hk + kh) * K, sizeof(T) * Hk * K, L);
    copy_rows_async<kChunk, kRowT, kBThreads>(base + Sm::kQTile, kLdT, q + (t0 * Hk + kh) * K, sizeof(T) * Hk * K, L);
    copy_rows_async<kChunk, int(sizeof(T)) * kBV, kBThreads>(base + Sm::kDoTile, int(sizeof(T)) * Sm::kLdV,
                                                             dout + (t0 * Hv + j) * V + v0, sizeof(T) * Hv * V, L);
#pragma unroll
    for (int part = 0; part < kPF; ++part) {
      constexpr int kRowP = 2 * kChunk, kLdP = 2 * kLdSq;
      copy_rows_async<kChunk, kRowP, kBThreads>(base + Sm::kPPlanes + 2 * part * kPlane, kLdP,
                                                P_planes + ((std::int64_t(c) * Hv + j) * kPF + part) * kChunk * kChunk,
                                                kRowP, kChunk);
      // the forward writes the rows of Ainv's parts token by token, none past the chunk
      copy_rows_async<kChunk, kRowP, kBThreads>(base + Sm::kAPlanes + 2 * part * kPlane, kLdP,
                                                A_planes + ((t0 * Hv + j) * kPF + part) * kChunk,
                                                2 * std::int64_t(Hv) * kPF * kChunk, L);
    }
    copy_rows_async<kChunk, 4 * kBwdRecord, kBThreads>(base + Sm::kRec, 4 * kBwdRecord,
                                                       rec + (t0 * Hv + j) * kBwdRecord,
                                                       4 * std::int64_t(Hv) * kBwdRecord, L);
  };

  if (c_end > c_first) issue(c_end - 1, 0);
  cp_async_commit();
  for (int c = c_end - 1, it = 0; c >= c_first; --c, ++it) {
    int const s = Sm::kStages == 2 ? (it & 1) : 0;
    cp_async_wait_all();
    __syncthreads();  // stage s has landed for every thread; every read of the other stage (the chunk after) is done
    if constexpr (Sm::kStages == 2) {
      if (c > c_first) issue(c - 1, s ^ 1);
      cp_async_commit();
    }
    unsigned char const* base = gd_state_smem + s * Sm::kStage;
    T const* k_tile = reinterpret_cast<T const*>(base + Sm::kKTile);
    T const* q_tile = reinterpret_cast<T const*>(base + Sm::kQTile);
    T const* do_tile = reinterpret_cast<T const*>(base + Sm::kDoTile);
    auto const* P_s = reinterpret_cast<__nv_bfloat16 const*>(base + Sm::kPPlanes);
    auto const* A_s = reinterpret_cast<__nv_bfloat16 const*>(base + Sm::kAPlanes);
    float const* rec_s = reinterpret_cast<float const*>(base + Sm::kRec);
    std::int64_t const t0 = bos + std::int64_t(c - c_first) * kChunk;
    int const L = static_cast<int>(eos - t0 < kChunk ? eos - t0 : kChunk);
    auto const rec_at = [&](int i, int field) { return rec_s[i * kBwdRecord + field]; };

    // dv_newᵀ = kBrSrk ⊙ (dhᵀ kᵀ) + doᵀ P over the chunk's tokens; token tiles past L stay zero. dh_next of chunk c
    // (the state gradient entering this step) goes out on the way as dh_nextᵀ [V][K] in tile order (state_tile), two
    // 16-byte stores per k-step.
    float* const dh_next = dh_out + (std::int64_t(c) * Hv + j) * V * K + state_tile(K, (v0 + wc) / 16, 0) + 4 * lane;
    float x[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {
#pragma unroll
      for (int nt = 2 * ks; nt < 2 * ks + 2; ++nt) {
        *reinterpret_cast<float4*>(dh_next + state_tile(K, 0, nt)) =
            make_float4(dh[nt][0], dh[nt][1], dh[nt][2], dh[nt][3]);
      }
      std::uint32_t a[kPF][4];
      a_from_acc<kPF>(dh[2 * ks], dh[2 * ks + 1], a);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (16 * np < L) {
          std::uint32_t b0[kPR][2], b1[kPR][2];
          load_b_cols_x2<T, kPR>(k_tile, Sm::kLdK, 16 * np, 16 * ks, lane, b0, b1);
          mma_split<kOrder>(x[2 * np], a, b0);
          mma_split<kOrder>(x[2 * np + 1], a, b1);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[nt][e] *= rec_at(8 * nt + 2 * t + (e & 1), kBrSrk);
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {  // token blocks r of doᵀ; P[r][i] = 0 for i > r
      if (16 * ks < L) {
        float f[8];
        load_a_trans_floats<T>(do_tile, Sm::kLdV, wc, 16 * ks, lane, f);
        std::uint32_t a[kPR][4];
        a_from_floats<kPR>(f, a);
#pragma unroll
        for (int np = 0; np <= ks; ++np) {
          std::uint32_t b0[kPF][2], b1[kPF][2];
          load_b_planes_rows_x2<kPF>(P_s, kPlane, kLdSq, 16 * ks, 16 * np, lane, b0, b1);
          mma_split<kOrder>(x[2 * np], a, b0);
          mma_split<kOrder>(x[2 * np + 1], a, b1);
        }
      }
    }

    // yᵀ = dv_newᵀ Ainv (Ainv[r][i] = 0 for i > r); y out, dv = β ⊙ y.
    float y[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (16 * ks < L) {
        std::uint32_t a[kPF][4];
        a_from_acc<kPF>(x[2 * ks], x[2 * ks + 1], a);
#pragma unroll
        for (int np = 0; np <= ks; ++np) {
          std::uint32_t b0[kPF][2], b1[kPF][2];
          load_b_planes_rows_x2<kPF>(A_s, kPlane, kLdSq, 16 * ks, 16 * np, lane, b0, b1);
          mma_split<kOrder>(y[2 * np], a, b0);
          mma_split<kOrder>(y[2 * np + 1], a, b1);
        }
      }
    }
    {
      std::int64_t const o = (t0 * Hv + j) * V + v0 + wc, stride = std::int64_t(Hv) * V;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        float dv_t[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) dv_t[e] = rec_at(8 * nt + 2 * t + (e & 1), kBrBeta) * y[nt][e];
        store_tile_pairs(y[nt], lane, y_out + o, stride, 8 * nt, L);
        store_tile_pairs(dv_t, lane, dv + o, stride, 8 * nt, L);
#pragma unroll
        for (int e = 0; e < 4; ++e) y[nt][e] *= rec_at(8 * nt + 2 * t + (e & 1), kBrCy);
      }
    }

    // dhᵀ ← e^{G_last} dhᵀ + (kBrCq ⊙ do)ᵀ q + (kBrCy ⊙ y)ᵀ k.
    float const gamma = rec_at(0, kBrGamma);
#pragma unroll
    for (int nt = 0; nt < kStateTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dh[nt][e] *= gamma;
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (16 * ks < L) {
        float f[8];
        load_a_trans_floats<T>(do_tile, Sm::kLdV, wc, 16 * ks, lane, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] *= rec_at(16 * ks + 8 * (e >> 2) + 2 * t + (e & 1), kBrCq);
        std::uint32_t aq[kPF][4], ay[kPF][4];
        a_from_floats<kPF>(f, aq);
        a_from_acc<kPF>(y[2 * ks], y[2 * ks + 1], ay);
#pragma unroll
        for (int np = 0; np < K / 16; ++np) {
          std::uint32_t b0[kPR][2], b1[kPR][2];
          load_b_rows_x2<T, kPR>(q_tile, Sm::kLdK, 16 * ks, 16 * np, lane, b0, b1);
          mma_split<kOrder>(dh[2 * np], aq, b0);
          mma_split<kOrder>(dh[2 * np + 1], aq, b1);
          load_b_rows_x2<T, kPR>(k_tile, Sm::kLdK, 16 * ks, 16 * np, lane, b0, b1);
          mma_split<kOrder>(dh[2 * np], ay, b0);
          mma_split<kOrder>(dh[2 * np + 1], ay, b1);
        }
      }
    }
    if constexpr (Sm::kStages == 1) {
      __syncthreads();  // every warp is done with the stage
      if (c > c_first) issue(c - 1, 0);
      cp_async_commit();
    }
  }

  if (p.dinitial_state != nullptr) {
#pragma unroll
    for (int nt = 0; nt < kStateTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int const d = 8 * nt + 2 * t + (e & 1), vr = 8 * (e >> 1);
        p.dinitial_state[state_off + std::int64_t(d) * V + vr] = dh[nt][e];
      }
    }
  }
}

// Warp 0, at the start of the per-chunk kernels: rstd_q and rstd_k of the chunk's rows (0 past len).
__device__ __forceinline__ void chunk_rstd_rows(GatedDeltaBwdParams const& p, int start, int len, int kh, float* rq,
                                                float* rk) {
  int const lane = threadIdx.x & 31;
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    int const r = 2 * lane + h2;
    bool const in = r < len;
    std::int64_t const t = std::int64_t(start) + r;
    rq[r] = in ? p.q_rstd[t * p.Hk + kh] : 0.0f;
    rk[r] = in ? p.k_rstd[t * p.Hk + kh] : 0.0f;
  }
}

// The per-chunk kernels' fp64 partial sums of dP ⊙ P + dA ⊙ A (E) and dA ⊙ A (F) over the warp's [16 × 32] tile of
// rows m0.., columns n0..: row sums of E and F (the quad's lanes summed; per column half of the row) and column sums
// of E (the tile's 8 row groups summed; per row block m0 / 16).
__device__ __forceinline__ void store_pair_sums(double const (&row_e)[2], double const (&row_f)[2],
                                                double const (&col_e)[4][2], int m0, int n0, int half, double* rowE,
                                                double* rowF, double* colE) {
  int const lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    double const re = sum_over_quad(row_e[hf]), rf = sum_over_quad(row_f[hf]);
    if (t4 == 0) {
      rowE[half * kChunk + m0 + g + 8 * hf] = re;
      rowF[half * kChunk + m0 + g + 8 * hf] = rf;
    }
  }
#pragma unroll
  for (int jn = 0; jn < 4; ++jn) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      double const ce = sum_over_rows(col_e[jn][b]);
      if (g == 0) colE[(m0 / 16) * kChunk + n0 + 8 * jn + 2 * t4 + b] = ce;
    }
  }
}

// Warp 0, at a value head's start in the per-chunk kernels: G (the fp64 in-chunk cumsum of g), β, e^G and
// e^{G_last − G} of the chunk's rows (0 past len).
template <typename T>
__device__ __forceinline__ void chunk_head_rows(GatedDeltaBwdParams const& p, int start, int len, int j, double* G,
                                                float* beta, float* Gam, float* s_end) {
  for_chunk_rows(p, start, len, j, G, [&](int r, bool in, std::int64_t t, double G_r, double G_last) {
    beta[r] = in ? to_float(static_cast<T const*>(p.beta)[t * p.Hv + j]) : 0.0f;
    Gam[r] = in ? expf(float(G_r)) : 0.0f;
    s_end[r] = in ? expf(float(G_last - G_r)) : 0.0f;
  });
}

// One element (row i) of the state terms S1 = do hᵀ, S2 = y hᵀ, S3 = v_new dh_nextᵀ (a1, a2, a3) into dq̂, dk̂ and the fp64
// sums of dG (s_g), dβ (s_b) and the e^{G_last} term (last); qv = scale·q̂ and kv = k̂ at that element.
// Acc: double in the fp32 kernel; float in the 16-bit one, which adds a slab's few terms in fp32 and carries the
// sums across slabs in fp64.
template <typename Acc>
__device__ __forceinline__ void fold_state_term(int i, float const* Gam, float const* beta, float const* s_end, float qv,
                                                float kv, float a1, float a2, float a3, float& dq, float& dk,
                                                Acc& s_g, Acc& s_b, Acc& last) {
  float const gi = Gam[i], bgi = beta[i] * Gam[i], si = s_end[i];
  dq += gi * a1;
  dk += si * a3 - bgi * a2;
  s_g += Acc(gi * qv * a1) - Acc(bgi * kv * a2) - Acc(si * kv * a3);
  s_b -= Acc(gi * kv * a2);
  last += Acc(si * kv * a3);
}

// A head's state sums to shared memory: s_g and s_b of the warp's rows m0 + lane/4 (+ 8) summed over the quad, apart
// per column half of the row; last and hd per warp. Ends with a barrier.
__device__ __forceinline__ void store_state_sums(double const (&s_g)[2], double const (&s_b)[2], double last, double hd,
                                                 int m0, int half, double* rowS, double* rowB, double* last_s,
                                                 double* hd_s) {
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    double const sg = sum_over_quad(s_g[hf]), sbv = sum_over_quad(s_b[hf]);
    if (t4 == 0) {
      rowS[half * kChunk + m0 + g + 8 * hf] = sg;
      rowB[half * kChunk + m0 + g + 8 * hf] = sbv;
    }
  }
  last = sum_over_warp(last);
  hd = sum_over_warp(hd);
  if (lane == 0) {
    last_s[warp] = last;
    hd_s[warp] = hd;
  }
  __syncthreads();
}

// The end of a value head's step in the per-chunk kernels, from the per-row partial sums in shared memory (fp64):
// dG_i = rows − columns of (dP ⊙ P + dA ⊙ A) + the state terms (+ the e^{G_last} terms at the last row), dβ out, then
// dg, the reverse cumulative sum of dG in the chunk. The whole block takes part; ends with a barrier (the next head
// overwrites the sums).
template <typename T>
__device__ __forceinline__ void chunk_dg_dbeta(GatedDeltaBwdParams const& p, int start, int len, int j,
                                               double const* rowE, double const* rowF, double const* colE,
                                               double const* rowS, double const* rowB, double* dG_s,
                                               double const* last_s, double const* hd_s, float const* Gam,
                                               float const* vy) {
  int const tid = threadIdx.x;
  if (tid < kChunk) {
    double dG = rowE[tid] + rowE[kChunk + tid] -
                (colE[tid] + colE[kChunk + tid] + colE[2 * kChunk + tid] + colE[3 * kChunk + tid]) + rowS[tid] +
                rowS[kChunk + tid];
    if (tid == len - 1) {  // exp(G_last) scales h_next's first term, and the to-the-end decays of every k̂
      double l = 0.0, hh = 0.0;
      for (int w = 0; w < kWarps; ++w) {
        l += last_s[w];
        hh += hd_s[w];
      }
      dG += l + Gam[tid] * hh;
    }
    dG_s[tid] = dG;
    if (tid < len) {
      double const db = rowF[tid] + rowF[kChunk + tid] + rowB[tid] + rowB[kChunk + tid] + vy[tid];
      static_cast<T*>(p.dbeta)[(std::int64_t(start) + tid) * p.Hv + j] = from_float<T>(float(db));
    }
  }
  __syncthreads();
  if (tid < len) {
    double acc = 0.0;
    for (int i = len - 1; i >= tid; --i) acc += dG_s[i];
    p.dg[(std::int64_t(start) + tid) * p.Hv + j] = float(acc);
  }
  __syncthreads();
}

// dq = rstd_q (scale·dq̂ − x̂ (x̂·scale·dq̂)) with x̂ = rstd_q q; dk likewise without the scale: the warp's accumulator
// tiles dq[nt], dk[nt] hold rows m0.. and columns col_of(nt)..; x_hat(i, col) gives {x̂_q, x̂_k} there. The row dots:
// each warp's columns, then the two warps of the row (half = 0, 1) in order.
template <typename T, int K, int kNT, class ColOf, class XHat>
__device__ __forceinline__ void chunk_dq_dk(GatedDeltaBwdParams const& p, int start, int len, int kh, int m0, int half,
                                            ColOf const& col_of, float (&dq)[kNT][4], float (&dk)[kNT][4],
                                            XHat const& x_hat, float const* rq, float const* rk, float* dot_s) {
  int const lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  float const scale = p.scale;
  float dot_q[2] = {0.0f, 0.0f}, dot_k[2] = {0.0f, 0.0f};
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int const i = m0 + g + 8 * (e >> 1), col = col_of(nt) + 2 * t4 + (e & 1);
      float2 const x = x_hat(i, col);
      dq[nt][e] *= scale;
      dot_q[e >> 1] += x.x * dq[nt][e];
      dot_k[e >> 1] += x.y * dk[nt][e];
    }
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float const dq_row = sum_over_quad(dot_q[hf]), dk_row = sum_over_quad(dot_k[hf]);
    if (t4 == 0) {
      dot_s[half * kChunk + m0 + g + 8 * hf] = dq_row;
      dot_s[(2 + half) * kChunk + m0 + g + 8 * hf] = dk_row;
    }
  }
  __syncthreads();
  auto* dq_out = static_cast<T*>(p.dq);
  auto* dk_out = static_cast<T*>(p.dk);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    int const i = m0 + g + 8 * hf;
    if (i >= len) continue;
    float const r_q = rq[i], r_k = rk[i];
    float const dot_qi = dot_s[i] + dot_s[kChunk + i], dot_ki = dot_s[2 * kChunk + i] + dot_s[3 * kChunk + i];
    std::int64_t const row = (std::int64_t(start + i) * p.Hk + kh) * K;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        int const col = col_of(nt) + 2 * t4 + b;
        float x = dq[nt][2 * hf + b], y = dk[nt][2 * hf + b];
        if (p.use_qk_l2norm) {
          float2 const xh = x_hat(i, col);
          x = r_q * (x - xh.x * dot_qi);
          y = r_k * (y - xh.y * dot_ki);
        }
        dq_out[row + col] = from_float<T>(x);
        dk_out[row + col] = from_float<T>(y);
      }
    }
  }
}

// Everything else of chunk c for the value heads j of key head kh, in head order, from dP = do v_newᵀ and
// dA = −y v_newᵀ (masked), per head:
//   dq̂ += (dP ⊙ decay) k̂ + exp(G) ⊙ (do hᵀ),
//   dk̂ += (dP ⊙ decay)ᵀ q̂ + (B + Bᵀ) k̂ − β exp(G) ⊙ (y hᵀ) + exp(G_last − G) ⊙ (v_new dh_nextᵀ), B = β ⊙ dA ⊙ decay,
//   dβ = Σ_j dA Â + v·y − exp(G) k̂·(y hᵀ),
//   dG = rows − columns of (dP ⊙ P + dA ⊙ A) + the state terms, dg its reverse cumulative sum in the chunk;
// then, with dq̂ and dk̂ summed over the group in registers, dq and dk: the scale and the l2norm backward
// dx = rstd (dx̂ − x̂ (x̂·dx̂)), x̂ = rstd·x. This kernel runs fp32 inputs (fp32 tiles, warp_mma's fp64 FMAs);
// gated_delta_bwd_chunk_mma below is the same computation for 16-bit inputs on the tensor cores.
template <typename T, int K, int V>
__global__ void __launch_bounds__(kThreads, 1)
    gated_delta_bwd_chunk(GatedDeltaBwdParams p, __nv_bfloat16 const* P_planes, float const* A_in, float const* dh_in,
                          float const* y_in) {
  static_assert(std::is_same_v<T, float>, "16-bit inputs run gated_delta_bwd_chunk_mma");
  using S = ChunkSmem<K, V>;
  constexpr int kPF = SplitPolicy<T>::kOrder + 1;
  constexpr int kLdK = S::kLdK, kLdV = S::kLdV, kLdL = S::kLdL;
  constexpr int kNJ = K / 16;  // dq̂/dk̂ column tiles per warp
  float* const sm = shared_floats();
  float *const q_s = sm + S::q, *const k_s = sm + S::k, *const do_s = sm + S::dout, *const y_s = sm + S::y,
               *const vn_s = sm + S::v_new, *const M1 = sm + S::R, *const Bm = M1 + kChunk * kLdL,
               *const h_s = sm + S::R, *const dhn_s = h_s + V * S::kLdS;
  float *const beta_s = sm + S::beta, *const Gam = sm + S::Gam, *const s_end = sm + S::s, *const rq = sm + S::rq,
               *const rk = sm + S::rk, *const vy = sm + S::vy, *const dot_s = sm + S::dots;
  double* const dsm = reinterpret_cast<double*>(sm);
  double *const G = dsm + S::G, *const rowE = dsm + S::rowE, *const rowF = dsm + S::rowF, *const colE = dsm + S::colE,
                *const rowS = dsm + S::rowS, *const rowB = dsm + S::rowB, *const dG_s = dsm + S::dG,
                *const last_s = dsm + S::last, *const hd_s = dsm + S::hd;
  int const c = blockIdx.x / p.Hk, kh = blockIdx.x % p.Hk, group = p.Hv / p.Hk;
  int const start = p.chunks[c], len = p.chunks[p.NC + c];
  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  auto const* v = static_cast<T const*>(p.v);
  if (warp == 0) chunk_rstd_rows(p, start, len, kh, rq, rk);
  __syncthreads();
  std::int64_t const qk0 = (std::int64_t(start) * p.Hk + kh) * K, qk_stride = std::int64_t(p.Hk) * K;
  float const scale = p.scale;
  load_tile(q_s, kLdK, static_cast<T const*>(p.q) + qk0, qk_stride, kChunk, K, len, K,
            [&](int r) { return scale * rq[r]; });
  load_tile(k_s, kLdK, static_cast<T const*>(p.k) + qk0, qk_stride, kChunk, K, len, K, [&](int r) { return rk[r]; });

  // dq̂, dk̂ [64 × K], summed over the group in registers: warp w owns rows 16·(w/2).., column tiles w%2, w%2 + 2, ..
  int const m0 = 16 * (warp >> 1), nb = 8 * (warp & 1);
  float dq[1][kNJ][4], dk[1][kNJ][4];
  zero(dq);
  zero(dk);
  for (int jj = 0; jj < group; ++jj) {
    int const j = kh * group + jj;
    if (warp == 0) chunk_head_rows<T>(p, start, len, j, G, beta_s, Gam, s_end);
    std::int64_t const tv0 = (std::int64_t(start) * p.Hv + j) * V, tv_stride = std::int64_t(p.Hv) * V;
    load_tile(do_s, kLdV, static_cast<T const*>(p.dout) + tv0, tv_stride, kChunk, V, len, V, Unit{});
    load_tile(y_s, kLdV, y_in + tv0, tv_stride, kChunk, V, len, V, Unit{});
    load_tile(vn_s, kLdV, static_cast<float const*>(p.v_new) + tv0, tv_stride, kChunk, V, len, V, Unit{});
    __syncthreads();
    for (int r = warp; r < kChunk; r += kWarps) {  // v·y of every row
      float part = 0.0f;
      if (r < len) {
        for (int col = lane; col < V; col += 32) part += to_float(v[tv0 + r * tv_stride + col]) * y_s[r * kLdV + col];
      }
      part = sum_over_warp(part);
      if (lane == 0) vy[r] = part;
    }

    float const* h_c = p.h + (std::int64_t(c) * p.Hv + j) * K * V;
    float const* dhn_c = dh_in + (std::int64_t(c) * p.Hv + j) * K * V;
    StateSlab<V, K> next_h, next_dh;  // in flight from here to the first state step
    next_h.load(h_c, 0);
    next_dh.load(dhn_c, 0);

    {  // D1 = do v_newᵀ, D2 = y v_newᵀ on [64 × 64]: warp w owns rows 16·(w/2).., columns 32·(w%2)..
      int const n0 = 32 * (warp & 1);
      float d1[1][4][4], d2[1][4][4];
      zero(d1);
      zero(d2);
      warp_mma<1, 4, V>(
          d1, m0, n0, 8, [&](int r, int kk) { return do_s[r * kLdV + kk]; },
          [&](int kk, int col) { return vn_s[col * kLdV + kk]; });
      warp_mma<1, 4, V>(
          d2, m0, n0, 8, [&](int r, int kk) { return y_s[r * kLdV + kk]; },
          [&](int kk, int col) { return vn_s[col * kLdV + kk]; });
      __nv_bfloat16 const* P_c = P_planes + (std::int64_t(c) * p.Hv + j) * kPF * kChunk * kChunk;
      float const* A_c = A_in + (std::int64_t(c) * p.Hv + j) * kChunk * kChunk;
      double row_e[2] = {0.0, 0.0}, row_f[2] = {0.0, 0.0}, col_e[4][2];
#pragma unroll
      for (int jn = 0; jn < 4; ++jn) {
        col_e[jn][0] = col_e[jn][1] = 0.0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int const i = m0 + g + 8 * (e >> 1), col = n0 + 8 * jn + 2 * t4 + (e & 1);
          float P_ij = 0.0f;
#pragma unroll
          for (int part = 0; part < kPF; ++part) P_ij += __bfloat162float(P_c[(part * kChunk + i) * kChunk + col]);
          float const A_ij = A_c[i * kChunk + col];
          float const decay = col <= i && i < len ? expf(float(G[i] - G[col])) : 0.0f;
          float const dA = col < i ? -d2[0][jn][e] : 0.0f;
          M1[i * kLdL + col] = d1[0][jn][e] * decay;
          Bm[i * kLdL + col] = beta_s[i] * dA * decay;
          float const E = d1[0][jn][e] * P_ij + dA * beta_s[i] * A_ij;  // dP ⊙ P + dA ⊙ A
          row_e[e >> 1] += E;
          row_f[e >> 1] += dA * A_ij;
          col_e[jn][e & 1] += E;
        }
      }
      store_pair_sums(row_e, row_f, col_e, m0, n0, warp & 1, rowE, rowF, colE);
    }
    __syncthreads();

    // dP̃ and B reach only dq and dk (rounded to T): split only in fp32 runs, like the raw inputs.
    warp_mma<1, kNJ, kChunk>(
        dq, m0, nb, 16, [&](int r, int kk) { return M1[r * kLdL + kk]; },
        [&](int kk, int col) { return k_s[kk * kLdK + col]; });
    warp_mma<1, kNJ, kChunk>(
        dk, m0, nb, 16, [&](int r, int kk) { return M1[kk * kLdL + r]; },
        [&](int kk, int col) { return q_s[kk * kLdK + col]; });
    warp_mma<1, kNJ, kChunk>(
        dk, m0, nb, 16, [&](int r, int kk) { return Bm[r * kLdL + kk] + Bm[kk * kLdL + r]; },
        [&](int kk, int col) { return k_s[kk * kLdK + col]; });
    __syncthreads();  // the slabs below overwrite dP̃ and B

    // The state terms, 32 state rows at a time (column slabs of hᵀ, dh_nextᵀ): S1 = do hᵀ, S2 = y hᵀ,
    // S3 = v_new dh_nextᵀ.
    double hd = 0.0, last = 0.0, s_g[2] = {0.0, 0.0}, s_b[2] = {0.0, 0.0};
#pragma unroll
    for (int sb = 0; sb < K / kSlab; ++sb) {
      // The slab's h and dh_next were loaded into registers during the previous step (the first during dP, dA).
#pragma unroll
      for (int u = 0; u < decltype(next_h)::kPer; ++u) {
        hd += double(next_h.v[u].x * next_dh.v[u].x) + double(next_h.v[u].y * next_dh.v[u].y) +
              double(next_h.v[u].z * next_dh.v[u].z) + double(next_h.v[u].w * next_dh.v[u].w);
      }
      next_h.store(h_s, S::kLdS);
      next_dh.store(dhn_s, S::kLdS);
      __syncthreads();
      if (sb + 1 < K / kSlab) {
        next_h.load(h_c, sb + 1);
        next_dh.load(dhn_c, sb + 1);
      }
      float s1[1][2][4], s2[1][2][4], s3[1][2][4];
      zero(s1);
      zero(s2);
      zero(s3);
      warp_mma<1, 2, V>(
          s1, m0, nb, 16, [&](int r, int kk) { return do_s[r * kLdV + kk]; },
          [&](int kk, int col) { return h_s[kk * S::kLdS + col]; });
      warp_mma<1, 2, V>(
          s2, m0, nb, 16, [&](int r, int kk) { return y_s[r * kLdV + kk]; },
          [&](int kk, int col) { return h_s[kk * S::kLdS + col]; });
      warp_mma<1, 2, V>(
          s3, m0, nb, 16, [&](int r, int kk) { return vn_s[r * kLdV + kk]; },
          [&](int kk, int col) { return dhn_s[kk * S::kLdS + col]; });
#pragma unroll
      for (int j2 = 0; j2 < 2; ++j2) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int const i = m0 + g + 8 * (e >> 1), kc = sb * kSlab + nb + 16 * j2 + 2 * t4 + (e & 1);
          fold_state_term(i, Gam, beta_s, s_end, q_s[i * kLdK + kc], k_s[i * kLdK + kc], s1[0][j2][e], s2[0][j2][e],
                          s3[0][j2][e], dq[0][2 * sb + j2][e], dk[0][2 * sb + j2][e], s_g[e >> 1], s_b[e >> 1], last);
        }
      }
      __syncthreads();
    }

    store_state_sums(s_g, s_b, last, hd, m0, warp & 1, rowS, rowB, last_s, hd_s);

    chunk_dg_dbeta<T>(p, start, len, j, rowE, rowF, colE, rowS, rowB, dG_s, last_s, hd_s, Gam, vy);
  }

  chunk_dq_dk<T, K>(p, start, len, kh, m0, warp & 1, [&](int jq) { return nb + 16 * jq; }, dq[0], dk[0],
                    [&](int i, int col) { return float2{q_s[i * kLdK + col] / scale, k_s[i * kLdK + col]}; }, rq, rk,
                    dot_s);
}

// gated_delta_bwd_chunk for 16-bit inputs on split-bf16 tile products: the raw q, k, do as bf16 tiles, the fp32
// intermediates (y, v_new, the dP̃ and B matrices, the h and dh_next slabs) as planes of kGradParts bf16 parts (one for
// bf16 runs, two for fp16; y and v_new of bf16 runs arrive as that part, Handover), every fragment through ldmatrix;
// P and Â on the warp's own [16 × 32] elements from q kᵀ and k kᵀ of the raw tiles (fp32), scaled and decayed there.
// The fp64 sums and the order of every sum are gated_delta_bwd_chunk's; Σ h ⊙ dh_next (hd, undamped in dg) is summed
// from the fp32 slabs, not from their parts.
template <typename T, int K, int V>
struct ChunkMmaSmem {
  static constexpr int kGP = SplitPolicy<T>::kGradParts;  // parts of an fp32 intermediate
  static constexpr int kLdK = K + kLdPad, kLdV = V + kLdPad;
  static constexpr int kVPlane = kChunk * kLdV;   // elements of one [64][kLdV] plane
  static constexpr int kLdS = kSlab + kLdPad;       // row stride of a slab plane (80 bytes: 8 rows, 8 bank quads)
  static constexpr int kSlabPlane = V * kLdS;        // elements of one [V][kLdS] plane: a slab of hᵀ or dh_nextᵀ
  // fp64 first: G and the partial sums of dG and dβ, as ChunkSmem
  static constexpr std::size_t kG = 0, kRowE = kG + 8 * kChunk, kRowF = kRowE + 8 * 2 * kChunk,
                               kColE = kRowF + 8 * 2 * kChunk, kRowS = kColE + 8 * 4 * kChunk,
                               kRowB = kRowS + 8 * 2 * kChunk, kDG = kRowB + 8 * 2 * kChunk, kLast = kDG + 8 * kChunk,
                               kHd = kLast + 8 * kWarps;
  // fp32 row data: β, e^G, e^{G_last − G}, rstd_q, rstd_k, v·y, the l2norm row dots [4][64]
  static constexpr std::size_t kBeta = kHd + 8 * kWarps, kGam = kBeta + 4 * kChunk, kSEnd = kGam + 4 * kChunk,
                               kRq = kSEnd + 4 * kChunk, kRk = kRq + 4 * kChunk, kVy = kRk + 4 * kChunk,
                               kDots = kVy + 4 * kChunk;
  static constexpr std::size_t kQTile = align16(kDots + 4 * 4 * kChunk);            // T [64][kLdK]
  static constexpr std::size_t kKTile = kQTile + sizeof(T) * kChunk * kLdK;         // T [64][kLdK]
  static constexpr std::size_t kDoTile = kKTile + sizeof(T) * kChunk * kLdK;        // T [64][kLdV]
  static constexpr std::size_t kYPlanes = align16(kDoTile + sizeof(T) * kChunk * kLdV);  // bf16 [kGP][64][kLdV]
  static constexpr std::size_t kVnPlanes = kYPlanes + 2 * kGP * kVPlane;                // bf16 [kGP][64][kLdV]
  // Then one region, first the four [kGP][64][kLdSq] planes of the dq̂ / dk̂ coefficient matrices (Mq, Mkq, Mkk,
  // MkkT), later the hᵀ and dh_nextᵀ slabs ([kGP][V][kLdS] each).
  static constexpr std::size_t kRegion = kVnPlanes + 2 * kGP * kVPlane;
  static constexpr std::size_t kMPlanes = 2 * 4 * kGP * kPlane, kSlabPlanes = 2 * 2 * kGP * kSlabPlane;
  static constexpr std::size_t kBase = kRegion + (kMPlanes > kSlabPlanes ? kMPlanes : kSlabPlanes);
  // Where it fits (one-part planes: bf16 runs), the next head's y, v_new (as stored, Handover<T>) and v rows are
  // staged by cp.async while the block works on the current head: [64][V] each, rows past the chunk zero.
  static constexpr std::size_t kHo = sizeof(Handover<T>);
  static constexpr std::size_t kStageY = align16(kBase), kStageVn = kStageY + kHo * kChunk * V,
                               kStageV = kStageVn + kHo * kChunk * V, kStagedEnd = kStageV + sizeof(T) * kChunk * V;
  static constexpr bool kStaged = kStagedEnd <= 227 * 1024;
  static constexpr std::size_t kBytes = kStaged ? kStagedEnd : kBase;
};

template <typename T, int K, int V>
__global__ void __launch_bounds__(kThreads, 1)
    gated_delta_bwd_chunk_mma(GatedDeltaBwdParams p, float const* dh_in, Handover<T> const* y_in) {
  using S = ChunkMmaSmem<T, K, V>;
  using Pol = SplitPolicy<T>;
  constexpr int kPR = Pol::kRawParts, kOrder = Pol::kOrder, kGP = S::kGP;
  constexpr int kLdK = S::kLdK, kLdV = S::kLdV;
  constexpr int kNT = K / 16;  // dq̂ / dk̂ column tiles per warp
  extern __shared__ __align__(16) unsigned char gd_chunk_smem[];
  auto const dbl = [&](std::size_t off) { return reinterpret_cast<double*>(gd_chunk_smem + off); };
  auto const flt = [&](std::size_t off) { return reinterpret_cast<float*>(gd_chunk_smem + off); };
  auto const bfp = [&](std::size_t off) { return reinterpret_cast<__nv_bfloat16*>(gd_chunk_smem + off); };
  double *const G = dbl(S::kG), *const rowE = dbl(S::kRowE), *const rowF = dbl(S::kRowF), *const colE = dbl(S::kColE),
                *const rowS = dbl(S::kRowS), *const rowB = dbl(S::kRowB), *const dG_s = dbl(S::kDG),
                *const last_s = dbl(S::kLast), *const hd_s = dbl(S::kHd);
  float *const beta_s = flt(S::kBeta), *const Gam = flt(S::kGam), *const s_end = flt(S::kSEnd), *const rq = flt(S::kRq),
               *const rk = flt(S::kRk), *const vy = flt(S::kVy), *const dot_s = flt(S::kDots);
  T* const q_tile = reinterpret_cast<T*>(gd_chunk_smem + S::kQTile);
  T* const k_tile = reinterpret_cast<T*>(gd_chunk_smem + S::kKTile);
  T* const do_tile = reinterpret_cast<T*>(gd_chunk_smem + S::kDoTile);
  __nv_bfloat16 *const y_pl = bfp(S::kYPlanes), *const vn_pl = bfp(S::kVnPlanes);
  __nv_bfloat16 *const Mq = bfp(S::kRegion), *const Mkq = Mq + kGP * kPlane, *const Mkk = Mkq + kGP * kPlane,
                       *const MkkT = Mkk + kGP * kPlane;
  __nv_bfloat16 *const h_pl = bfp(S::kRegion), *const dh_pl = h_pl + kGP * S::kSlabPlane;

  int const c = blockIdx.x / p.Hk, kh = blockIdx.x % p.Hk, group = p.Hv / p.Hk;
  int const start = p.chunks[c], len = p.chunks[p.NC + c];
  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  using Ho = Handover<T>;
  auto const* v = static_cast<T const*>(p.v);
  auto const* v_new = static_cast<Ho const*>(p.v_new);
  float const scale = p.scale;

  // The raw q, k rows of the chunk (zeros past len) and their rstd.
  {
    std::int64_t const qk0 = (std::int64_t(start) * p.Hk + kh) * K, stride = sizeof(T) * std::int64_t(p.Hk) * K;
    copy_rows_async<kChunk, int(sizeof(T)) * K, kThreads>(q_tile, int(sizeof(T)) * kLdK,
                                                          static_cast<T const*>(p.q) + qk0, stride, len);
    copy_rows_async<kChunk, int(sizeof(T)) * K, kThreads>(k_tile, int(sizeof(T)) * kLdK,
                                                          static_cast<T const*>(p.k) + qk0, stride, len);
    cp_async_commit();
  }
  if (warp == 0) chunk_rstd_rows(p, start, len, kh, rq, rk);

  // dq̂, dk̂ [64 × K], summed over the group in registers: warp w owns rows 16·(w/2).. and, in every 32 columns, the
  // 16 starting at 16·(w%2): tile nt covers columns col0(nt) = 32·(nt/2) + 16·(w%2) + 8·(nt%2).
  int const m0 = 16 * (warp >> 1), half_w = warp & 1;
  auto const col0 = [&](int nt) { return 32 * (nt >> 1) + 16 * half_w + 8 * (nt & 1); };
  float dq[kNT][4] = {}, dk[kNT][4] = {};
  std::int64_t const tv_stride = std::int64_t(p.Hv) * V;
  auto const head_rows = [&](int jj) { return (std::int64_t(start) * p.Hv + kh * group + jj) * V; };
  auto const issue_do = [&](int jj) {  // value head kh·group + jj's do rows
    copy_rows_async<kChunk, int(sizeof(T)) * V, kThreads>(
        do_tile, int(sizeof(T)) * kLdV, static_cast<T const*>(p.dout) + head_rows(jj), sizeof(T) * tv_stride, len);
  };
  auto const issue_staged = [&](int jj) {  // its y, v_new and v rows into the staging region
    if constexpr (S::kStaged) {
      std::int64_t const tv = head_rows(jj);
      constexpr int kRowH = int(S::kHo) * V;
      copy_rows_async<kChunk, kRowH, kThreads>(gd_chunk_smem + S::kStageY, kRowH, y_in + tv, S::kHo * tv_stride, len);
      copy_rows_async<kChunk, kRowH, kThreads>(gd_chunk_smem + S::kStageVn, kRowH, v_new + tv, S::kHo * tv_stride,
                                               len);
      copy_rows_async<kChunk, int(sizeof(T)) * V, kThreads>(gd_chunk_smem + S::kStageV, int(sizeof(T)) * V, v + tv,
                                                            sizeof(T) * tv_stride, len);
    }
  };
  if constexpr (S::kStaged) {
    issue_do(0);
    issue_staged(0);
    cp_async_commit();
  }
  for (int jj = 0; jj < group; ++jj) {
    int const j = kh * group + jj;
    std::int64_t const tv0 = head_rows(jj);
    {  // do rows by cp.async, y and v_new as planes of bf16 parts
      if constexpr (S::kStaged) {  // staged during the previous head (the first: in the prologue)
        cp_async_wait_all();
        __syncthreads();
      } else {
        issue_do(jj);
        cp_async_commit();
      }
      // 4 columns per thread, V/4 consecutive lanes per row, every load of the head in flight at once; v·y of each
      // row (its V/4 lanes' partial dots, butterfly-summed) on the way.
      constexpr int kIters = kChunk * V / 4 / kThreads;
      static_assert((V / 4) <= 32 && 32 % (V / 4) == 0, "rows of whole lane groups");
      // (A bf16 hand-over holds the one part already: its split below is exact.)
      float yv[kIters][4], nv[kIters][4], vv[kIters][4];
#pragma unroll
      for (int u = 0; u < kIters; ++u) {
        int const idx = tid + u * kThreads, r = idx / (V / 4), c4 = 4 * (idx % (V / 4));
        if constexpr (S::kStaged) {
          load4(reinterpret_cast<Ho const*>(gd_chunk_smem + S::kStageY) + r * V + c4, yv[u]);
          load4(reinterpret_cast<Ho const*>(gd_chunk_smem + S::kStageVn) + r * V + c4, nv[u]);
          load4(reinterpret_cast<T const*>(gd_chunk_smem + S::kStageV) + r * V + c4, vv[u]);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) yv[u][e] = nv[u][e] = vv[u][e] = 0.0f;
          if (r < len) {
            std::int64_t const off = tv0 + r * tv_stride + c4;
            load4(y_in + off, yv[u]);
            load4(v_new + off, nv[u]);
            load4(v + off, vv[u]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kIters; ++u) {
        int const idx = tid + u * kThreads, r = idx / (V / 4), c4 = 4 * (idx % (V / 4));
        std::uint32_t y0[kGP], y1[kGP], n0w[kGP], n1w[kGP];
        split_pair<kGP>(yv[u][0], yv[u][1], y0);
        split_pair<kGP>(yv[u][2], yv[u][3], y1);
        split_pair<kGP>(nv[u][0], nv[u][1], n0w);
        split_pair<kGP>(nv[u][2], nv[u][3], n1w);
#pragma unroll
        for (int part = 0; part < kGP; ++part) {
          *reinterpret_cast<uint2*>(y_pl + part * S::kVPlane + r * kLdV + c4) = make_uint2(y0[part], y1[part]);
          *reinterpret_cast<uint2*>(vn_pl + part * S::kVPlane + r * kLdV + c4) = make_uint2(n0w[part], n1w[part]);
        }
        float dot = vv[u][0] * yv[u][0] + vv[u][1] * yv[u][1] + vv[u][2] * yv[u][2] + vv[u][3] * yv[u][3];
#pragma unroll
        for (int m = V / 8; m >= 1; m >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, m);
        if (idx % (V / 4) == 0) vy[r] = dot;
      }
    }
    if (warp == 0) chunk_head_rows<T>(p, start, len, j, G, beta_s, Gam, s_end);
    float const* h_c = p.h + (std::int64_t(c) * p.Hv + j) * K * V;
    float const* dhn_c = dh_in + (std::int64_t(c) * p.Hv + j) * K * V;
    StateSlab<V, K> next_h, next_dh;  // in flight from here to the first state step
    next_h.load(h_c, 0);
    next_dh.load(dhn_c, 0);
    cp_async_wait_all();
    __syncthreads();
    if (S::kStaged && jj + 1 < group) {  // every staged row read: the next head's stream in
      issue_staged(jj + 1);
      cp_async_commit();
    }

    {  // D1 = do v_newᵀ, D2 = y v_newᵀ on [64 × 64]: warp w owns rows m0.., columns 32·(w%2)..
      int const n0 = 32 * half_w;
      // S = q kᵀ and Ŝ = k kᵀ of the raw rows on the same elements (P and Â once scaled and decayed below), ahead of
      // the D products: their tiles landed with the block's first barrier
      float sq[4][4] = {}, sk[4][4] = {};
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks) {
        std::uint32_t a_q[kPR][4], a_k[kPR][4];
        load_a_rows<T, kPR>(q_tile, kLdK, m0, 16 * ks, lane, a_q);
        load_a_rows<T, kPR>(k_tile, kLdK, m0, 16 * ks, lane, a_k);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          std::uint32_t b0[kPR][2], b1[kPR][2];
          load_b_cols_x2<T, kPR>(k_tile, kLdK, n0 + 16 * np, 16 * ks, lane, b0, b1);
          mma_split<kOrder>(sq[2 * np], a_q, b0);
          mma_split<kOrder>(sq[2 * np + 1], a_q, b1);
          mma_split<kOrder>(sk[2 * np], a_k, b0);
          mma_split<kOrder>(sk[2 * np + 1], a_k, b1);
        }
      }
      float d1[4][4] = {}, d2[4][4] = {};
#pragma unroll
      for (int ks = 0; ks < V / 16; ++ks) {
        std::uint32_t a_do[kPR][4], a_y[kGP][4];
        load_a_rows<T, kPR>(do_tile, kLdV, m0, 16 * ks, lane, a_do);
        load_a_planes<kGP>(y_pl, S::kVPlane, kLdV, m0, 16 * ks, lane, a_y);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          std::uint32_t b0[kGP][2], b1[kGP][2];
          load_b_planes_cols_x2<kGP>(vn_pl, S::kVPlane, kLdV, n0 + 16 * np, 16 * ks, lane, b0, b1);
          mma_split<kOrder>(d1[2 * np], a_do, b0);
          mma_split<kOrder>(d1[2 * np + 1], a_do, b1);
          mma_split<kOrder>(d2[2 * np], a_y, b0);
          mma_split<kOrder>(d2[2 * np + 1], a_y, b1);
        }
      }
      double row_e[2] = {0.0, 0.0}, row_f[2] = {0.0, 0.0}, col_e[4][2];
#pragma unroll
      for (int jn = 0; jn < 4; ++jn) {
        col_e[jn][0] = col_e[jn][1] = 0.0;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          int const i = m0 + g + 8 * hf, col = n0 + 8 * jn + 2 * t4;
          float mq[2], mkk[2];
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            int const e = 2 * hf + b, cc = col + b;
            float const decay = cc <= i && i < len ? expf(float(G[i] - G[cc])) : 0.0f;
            float const P_ij = (scale * rq[i]) * rk[cc] * sq[jn][e] * decay;
            float const A_ij = cc < i ? rk[i] * rk[cc] * sk[jn][e] * decay : 0.0f;
            float const dA = cc < i ? -d2[jn][e] : 0.0f;
            float const M1 = d1[jn][e] * decay, Bm = beta_s[i] * dA * decay;
            float const E = d1[jn][e] * P_ij + dA * beta_s[i] * A_ij;  // dP ⊙ P + dA ⊙ A
            row_e[hf] += E;
            row_f[hf] += dA * A_ij;
            col_e[jn][b] += E;
            mq[b] = M1 * rk[cc];
            mkk[b] = Bm * rk[cc];
            // the transposed coefficients: dk̂[cc] += M1[i][cc] q̂_i and Bm[i][cc] k̂_i
            __nv_bfloat16 wq[kGP], wk[kGP];
            split_one<kGP>(M1 * (scale * rq[i]), wq);
            split_one<kGP>(Bm * rk[i], wk);
#pragma unroll
            for (int part = 0; part < kGP; ++part) {
              Mkq[part * kPlane + cc * kLdSq + i] = wq[part];
              MkkT[part * kPlane + cc * kLdSq + i] = wk[part];
            }
          }
          std::uint32_t wq[kGP], wk[kGP];
          split_pair<kGP>(mq[0], mq[1], wq);
          split_pair<kGP>(mkk[0], mkk[1], wk);
#pragma unroll
          for (int part = 0; part < kGP; ++part) {
            *reinterpret_cast<std::uint32_t*>(Mq + part * kPlane + i * kLdSq + col) = wq[part];
            *reinterpret_cast<std::uint32_t*>(Mkk + part * kPlane + i * kLdSq + col) = wk[part];
          }
        }
      }
      store_pair_sums(row_e, row_f, col_e, m0, n0, half_w, rowE, rowF, colE);
    }
    __syncthreads();

    {  // dq̂ += Mq k, dk̂ += Mkq q + (Mkk + MkkT) k; Mq, Mkk vanish above the diagonal blocks, Mkq, MkkT below
      int const rb = m0 / 16;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        bool const lower = ks <= rb, upper = ks >= rb;
        std::uint32_t a_q[kGP][4], a_kq[kGP][4], a_kk[kGP][4], a_kt[kGP][4];
        if (lower) {
          load_a_planes<kGP>(Mq, kPlane, kLdSq, m0, 16 * ks, lane, a_q);
          load_a_planes<kGP>(Mkk, kPlane, kLdSq, m0, 16 * ks, lane, a_kk);
        }
        if (upper) {
          load_a_planes<kGP>(Mkq, kPlane, kLdSq, m0, 16 * ks, lane, a_kq);
          load_a_planes<kGP>(MkkT, kPlane, kLdSq, m0, 16 * ks, lane, a_kt);
        }
#pragma unroll
        for (int sb = 0; sb < K / 32; ++sb) {
          std::uint32_t b0[kPR][2], b1[kPR][2];
          load_b_rows_x2<T, kPR>(k_tile, kLdK, 16 * ks, col0(2 * sb), lane, b0, b1);
          if (lower) {
            mma_split<kOrder>(dq[2 * sb], a_q, b0);
            mma_split<kOrder>(dq[2 * sb + 1], a_q, b1);
            mma_split<kOrder>(dk[2 * sb], a_kk, b0);
            mma_split<kOrder>(dk[2 * sb + 1], a_kk, b1);
          }
          if (upper) {
            mma_split<kOrder>(dk[2 * sb], a_kt, b0);
            mma_split<kOrder>(dk[2 * sb + 1], a_kt, b1);
            load_b_rows_x2<T, kPR>(q_tile, kLdK, 16 * ks, col0(2 * sb), lane, b0, b1);
            mma_split<kOrder>(dk[2 * sb], a_kq, b0);
            mma_split<kOrder>(dk[2 * sb + 1], a_kq, b1);
          }
        }
      }
    }
    __syncthreads();  // the slabs below overwrite the coefficient planes

    // The state terms, kSlab state rows at a time (column slabs of hᵀ, dh_nextᵀ): S1 = do hᵀ, S2 = y hᵀ,
    // S3 = v_new dh_nextᵀ over the warp's 16 columns of the slab.
    double hd = 0.0, last = 0.0, s_g[2] = {0.0, 0.0}, s_b[2] = {0.0, 0.0};
#pragma unroll
    for (int sb = 0; sb < K / kSlab; ++sb) {
      hd += double(next_h.dot(next_dh));  // the thread's share of the slab in fp32, then the head's sum in fp64
#pragma unroll
      for (int u = 0; u < decltype(next_h)::kPer; ++u) {  // the staged slab rows as planes
        int const at = decltype(next_h)::row(u) * S::kLdS + decltype(next_h)::col(u), below = 8 * S::kLdS;
        std::uint32_t h0[kGP], h1[kGP], d0w[kGP], d1w[kGP];
        split_pair<kGP>(next_h.v[u].x, next_h.v[u].y, h0);
        split_pair<kGP>(next_h.v[u].z, next_h.v[u].w, h1);
        split_pair<kGP>(next_dh.v[u].x, next_dh.v[u].y, d0w);
        split_pair<kGP>(next_dh.v[u].z, next_dh.v[u].w, d1w);
#pragma unroll
        for (int part = 0; part < kGP; ++part) {
          auto* const hp = reinterpret_cast<std::uint32_t*>(h_pl + part * S::kSlabPlane + at);
          auto* const dp = reinterpret_cast<std::uint32_t*>(dh_pl + part * S::kSlabPlane + at);
          hp[0] = h0[part];
          hp[below / 2] = h1[part];
          dp[0] = d0w[part];
          dp[below / 2] = d1w[part];
        }
      }
      __syncthreads();
      if (sb + 1 < K / kSlab) {
        next_h.load(h_c, sb + 1);
        next_dh.load(dhn_c, sb + 1);
      }
      float s1[2][4] = {}, s2[2][4] = {}, s3[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < V / 16; ++ks) {
        std::uint32_t a_do[kPR][4], a_y[kGP][4], a_vn[kGP][4];
        load_a_rows<T, kPR>(do_tile, kLdV, m0, 16 * ks, lane, a_do);
        load_a_planes<kGP>(y_pl, S::kVPlane, kLdV, m0, 16 * ks, lane, a_y);
        load_a_planes<kGP>(vn_pl, S::kVPlane, kLdV, m0, 16 * ks, lane, a_vn);
        std::uint32_t bh0[kGP][2], bh1[kGP][2], bd0[kGP][2], bd1[kGP][2];
        load_b_planes_rows_x2<kGP>(h_pl, S::kSlabPlane, S::kLdS, 16 * ks, 16 * half_w, lane, bh0, bh1);
        load_b_planes_rows_x2<kGP>(dh_pl, S::kSlabPlane, S::kLdS, 16 * ks, 16 * half_w, lane, bd0, bd1);
        mma_split<kOrder>(s1[0], a_do, bh0);
        mma_split<kOrder>(s1[1], a_do, bh1);
        mma_split<kOrder>(s2[0], a_y, bh0);
        mma_split<kOrder>(s2[1], a_y, bh1);
        mma_split<kOrder>(s3[0], a_vn, bd0);
        mma_split<kOrder>(s3[1], a_vn, bd1);
      }
      float sg_f[2] = {0.0f, 0.0f}, sb_f[2] = {0.0f, 0.0f}, last_f = 0.0f;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int const i = m0 + g + 8 * (e >> 1), kc = col0(2 * sb + u) + 2 * t4 + (e & 1);
          float const qv = (scale * rq[i]) * to_float(q_tile[i * kLdK + kc]);
          float const kv = rk[i] * to_float(k_tile[i * kLdK + kc]);
          fold_state_term(i, Gam, beta_s, s_end, qv, kv, s1[u][e], s2[u][e], s3[u][e], dq[2 * sb + u][e],
                          dk[2 * sb + u][e], sg_f[e >> 1], sb_f[e >> 1], last_f);
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        s_g[hf] += double(sg_f[hf]);
        s_b[hf] += double(sb_f[hf]);
      }
      last += double(last_f);
      __syncthreads();
    }
    if (S::kStaged && jj + 1 < group) {  // every read of this head's do done
      issue_do(jj + 1);
      cp_async_commit();
    }

    store_state_sums(s_g, s_b, last, hd, m0, half_w, rowS, rowB, last_s, hd_s);
    chunk_dg_dbeta<T>(p, start, len, j, rowE, rowF, colE, rowS, rowB, dG_s, last_s, hd_s, Gam, vy);
  }
  chunk_dq_dk<T, K>(p, start, len, kh, m0, half_w, col0, dq, dk, [&](int i, int col) {
    return float2{rq[i] * to_float(q_tile[i * kLdK + col]), rk[i] * to_float(k_tile[i * kLdK + col])};
  }, rq, rk, dot_s);
}

}  // namespace fusepack::gated_delta_bwd_detail
