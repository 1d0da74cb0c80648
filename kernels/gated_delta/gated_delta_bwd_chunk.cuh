// Backward stage 3 of the chunked gated delta rule, per (chunk, key head): dβ and dg of the group's value heads in
// head order, their dq̂ and dk̂ summed in registers, then the scale and the l2norm backward: dq, dk.
// gated_delta_bwd_chunk runs fp32 inputs (fp32 tiles, fp64-FMA products), gated_delta_bwd_chunk_mma 16-bit inputs
// (split-bf16 tensor-core products); both share the helpers here and the order of every sum. Reads q, k, v, do,
// q_rstd, k_rstd, g, β, the saved h and v_new, stage 2's dh_next and y (and for fp32 runs stage 1's P and Â);
// writes dq, dk, dg, dβ.
#pragma once

#include "kernels/gated_delta/gated_delta_bwd_common.cuh"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace fusepack::gated_delta_bwd_detail {

using namespace gated_delta_mma;

constexpr int kSlab = 32;  // rows of h and dh_next per step of gated_delta_bwd_chunk

// Two neighbouring 16-bit elements (4-byte aligned) in one 4-byte shared-memory load, widened to fp32.
template <typename T>
__device__ __forceinline__ float2 load_pair(T const* at) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  std::uint32_t const w = *reinterpret_cast<std::uint32_t const*>(at);
  T h[2];
  memcpy(h, &w, sizeof(w));
  return make_float2(to_float(h[0]), to_float(h[1]));
}

// Two neighbouring elements of a global tensor (the first at an even element offset) in one store, rounded to T.
template <typename T>
__device__ __forceinline__ void store_pair(T* at, float x0, float x1) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float2*>(at) = make_float2(x0, x1);
  } else {
    T const h[2] = {from_float<T>(x0), from_float<T>(x1)};
    std::uint32_t w;
    memcpy(&w, h, sizeof(w));
    *reinterpret_cast<std::uint32_t*>(at) = w;
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
  // Slab sb of the state of one (chunk, value head) at `state`; kL2Only: past L1, for a state a kernel running beside
  // this one is writing (grid_launch_dependents).
  template <bool kL2Only = false>
  __device__ __forceinline__ void load(float const* state, int sb) {
    float const* const base = state + state_tile(K, vb0(), sb * kTiles + nt()) + 4 * (threadIdx.x & 31);
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      auto const* const at = reinterpret_cast<float4 const*>(base + state_tile(K, kVbStep * u, 0));
      v[u] = kL2Only ? __ldcg(at) : *at;
    }
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

// Shared-memory layout of gated_delta_bwd_chunk (fp32 elements). Pitches: K + 8 and 64 + 8 where the hot reads walk
// a column (transposed operands: 8 mod 32 spreads lanes (t, g) over 32 banks), V + 4 and 64 + 4 where they walk a
// row (4 mod 32).
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

// Its dynamic shared memory (the fp64 arrays counted as two floats each).
template <int K, int V>
constexpr std::size_t chunk_smem_bytes() {
  return sizeof(float) * ChunkSmem<K, V>::floats;
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

// A chunk row's factors of the state terms: e^{G_i}, β_i e^{G_i}, e^{G_last − G_i}.
struct StateRow {
  float gi, bgi, si;
};
__device__ __forceinline__ StateRow state_row(int i, float const* Gam, float const* beta, float const* s_end) {
  return {Gam[i], beta[i] * Gam[i], s_end[i]};
}

// One element (row i, its factors r) of the state terms S1 = do hᵀ, S2 = y hᵀ, S3 = v_new dh_nextᵀ (a1, a2, a3) into
// dq̂, dk̂ and the fp64 sums of dG (s_g), dβ (s_b) and the e^{G_last} term (last); qv = scale·q̂ and kv = k̂ at that
// element. Acc: double in the fp32 kernel; float in the 16-bit one, which adds a slab's few terms in fp32 and carries
// the sums across slabs in fp64.
template <typename Acc>
__device__ __forceinline__ void fold_state_term(StateRow const& r, float qv, float kv, float a1, float a2, float a3,
                                                float& dq, float& dk, Acc& s_g, Acc& s_b, Acc& last) {
  float const gi = r.gi, bgi = r.bgi, si = r.si;
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
// tiles dq[nt], dk[nt] hold rows m0.. and columns col_of(nt)..; x_hat(i, col) gives {x̂_q, x̂_k} at row i, columns
// col and col + 1 (col even) as {x̂_q(col), x̂_q(col + 1), x̂_k(col), x̂_k(col + 1)}. The row dots: each warp's
// columns, then the two warps of the row (half = 0, 1) in order. dq and dk go out two neighbouring columns a store.
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
    for (int hf = 0; hf < 2; ++hf) {
      float4 const x = x_hat(m0 + g + 8 * hf, col_of(nt) + 2 * t4);
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        int const e = 2 * hf + b;
        dq[nt][e] *= scale;
        dot_q[hf] += (b ? x.y : x.x) * dq[nt][e];
        dot_k[hf] += (b ? x.w : x.z) * dk[nt][e];
      }
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
      int const col = col_of(nt) + 2 * t4;
      float x[2], y[2];
      float4 const xh = p.use_qk_l2norm ? x_hat(i, col) : float4{};
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        x[b] = dq[nt][2 * hf + b];
        y[b] = dk[nt][2 * hf + b];
        if (p.use_qk_l2norm) {
          x[b] = r_q * (x[b] - (b ? xh.y : xh.x) * dot_qi);
          y[b] = r_k * (y[b] - (b ? xh.w : xh.z) * dot_ki);
        }
      }
      store_pair(dq_out + row + col, x[0], x[1]);
      store_pair(dk_out + row + col, y[0], y[1]);
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
  GatedDeltaChunks const table = gated_delta_chunks(p);
  int const start = table.start(c), len = table.len(c);
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
    load_tile(vn_s, kLdV, p.v_new + tv0, tv_stride, kChunk, V, len, V, Unit{});
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
          fold_state_term(state_row(i, Gam, beta_s, s_end), q_s[i * kLdK + kc], k_s[i * kLdK + kc], s1[0][j2][e],
                          s2[0][j2][e], s3[0][j2][e], dq[0][2 * sb + j2][e], dk[0][2 * sb + j2][e], s_g[e >> 1],
                          s_b[e >> 1], last);
        }
      }
      __syncthreads();
    }

    store_state_sums(s_g, s_b, last, hd, m0, warp & 1, rowS, rowB, last_s, hd_s);

    chunk_dg_dbeta<T>(p, start, len, j, rowE, rowF, colE, rowS, rowB, dG_s, last_s, hd_s, Gam, vy);
  }

  chunk_dq_dk<T, K>(p, start, len, kh, m0, warp & 1, [&](int jq) { return nb + 16 * jq; }, dq[0], dk[0],
                    [&](int i, int col) {
                      float const* const q = q_s + i * kLdK + col;
                      float const* const k = k_s + i * kLdK + col;
                      return float4{q[0] / scale, q[1] / scale, k[0], k[1]};
                    },
                    rq, rk, dot_s);
}

// gated_delta_bwd_chunk for 16-bit inputs on split-bf16 tile products: the raw q, k, do as bf16 tiles, the fp32
// intermediates (y, the dP̃ and B matrices, the h slabs) as planes of kGradParts bf16 parts (one for bf16 runs, two
// for fp16; y of bf16 runs arrives as that part, Handover), v_new and the dh_next slabs as kVnDhParts planes
// (v_new dh_nextᵀ feeds dg; do v_newᵀ and y v_newᵀ read its first kGradParts), every fragment through ldmatrix;
// P and Â on the warp's own [16 × 32] elements from q kᵀ and k kᵀ of the raw tiles (fp32), scaled and decayed there.
// The fp64 sums and the order of every sum are gated_delta_bwd_chunk's; Σ h ⊙ dh_next (hd, undamped in dg) is summed
// from the fp32 slabs, not from their parts.
template <typename T, int K, int V>
struct ChunkMmaSmem {
  static constexpr int kGP = SplitPolicy<T>::kGradParts;  // parts of an fp32 intermediate
  static constexpr int kVN = SplitPolicy<T>::kVnDhParts;  // parts of v_new and dh_next
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
  static constexpr std::size_t kVnPlanes = kYPlanes + 2 * kGP * kVPlane;                // bf16 [kVN][64][kLdV]
  // Then one region, first the four [kGP][64][kLdSq] planes of the dq̂ / dk̂ coefficient matrices (Mq, Mkq, Mkk,
  // MkkT), later the hᵀ and dh_nextᵀ slabs ([kGP][V][kLdS] and [kVN][V][kLdS]).
  static constexpr std::size_t kRegion = kVnPlanes + 2 * kVN * kVPlane;
  static constexpr std::size_t kMPlanes = 2 * 4 * kGP * kPlane, kSlabPlanes = 2 * (kGP + kVN) * kSlabPlane;
  static constexpr std::size_t kBase = kRegion + (kMPlanes > kSlabPlanes ? kMPlanes : kSlabPlanes);
  // Where it fits (one-part planes of y: bf16 runs), the next head's y (as stored, Handover<T>), v_new (fp32) and v
  // rows are staged by cp.async while the block works on the current head: [64][V] each, rows past the chunk zero.
  static constexpr std::size_t kHo = sizeof(Handover<T>);
  static constexpr std::size_t kStageY = align16(kBase), kStageVn = kStageY + kHo * kChunk * V,
                               kStageV = kStageVn + sizeof(float) * kChunk * V,
                               kStagedEnd = kStageV + sizeof(T) * kChunk * V;
  static constexpr bool kStaged = kStagedEnd <= kMaxBlockSmem;
  static constexpr std::size_t kBytes = kStaged ? kStagedEnd : kBase;
};

// kBeside: launched as the programmatic dependent of the state recurrence in warpgroup products
// (gated_delta_bwd_state_wg), which publishes per block how many chunks, from each example's last, it has written
// dh_next and y for (`done` [N, Hv, V / 64]): the blocks take the chunks last first, each waits for its chunk's counts
// before it reads y or dh_next (past L1), and the grid's last block ends after the recurrence.
template <typename T, int K, int V, bool kBeside = false>
__global__ void __launch_bounds__(kThreads, 1)
    gated_delta_bwd_chunk_mma(GatedDeltaBwdParams p, float const* dh_in, Handover<T> const* y_in,
                              int const* done) {
  using S = ChunkMmaSmem<T, K, V>;
  using Pol = SplitPolicy<T>;
  constexpr int kPR = Pol::kRawParts, kOrder = Pol::kOrder, kGP = S::kGP, kVN = S::kVN;
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

  int const c_launched = blockIdx.x / p.Hk, kh = blockIdx.x % p.Hk, group = p.Hv / p.Hk;
  int const c = kBeside ? p.NC - 1 - c_launched : c_launched;  // beside the recurrence: the last chunks first
  GatedDeltaChunks const table = gated_delta_chunks(p);
  int const start = table.start(c), len = table.len(c);
  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  using Ho = Handover<T>;
  auto const* v = static_cast<T const*>(p.v);
  float const* const v_new = p.v_new;
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
      copy_rows_async<kChunk, int(sizeof(float)) * V, kThreads>(gd_chunk_smem + S::kStageVn, int(sizeof(float)) * V,
                                                                v_new + tv, sizeof(float) * tv_stride, len);
      copy_rows_async<kChunk, int(sizeof(T)) * V, kThreads>(gd_chunk_smem + S::kStageV, int(sizeof(T)) * V, v + tv,
                                                            sizeof(T) * tv_stride, len);
    }
  };
  if constexpr (kBeside) {  // until the recurrence's blocks of the group's value heads have written the chunk
    constexpr int kTiles = V / 64;  // the recurrence's blocks per value head
    static_assert(V % 64 == 0, "the recurrence in warpgroup products runs blocks of 64 value columns");
    static_assert(S::kStaged, "y arrives by cp.async.cg (past L1) only where the block stages it");
    int const n = table.example(c), step = table.first_chunk(n + 1) - 1 - c;  // counted from the example's last
    for (int b = tid; b < group * kTiles; b += kThreads) {
      int const* const count = done + (std::int64_t(n) * p.Hv + kh * group) * kTiles + b;
      while (acquire_count(count) <= step) __nanosleep(200);
    }
    __syncthreads();
  }
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
          load4(reinterpret_cast<float const*>(gd_chunk_smem + S::kStageVn) + r * V + c4, nv[u]);
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
        std::uint32_t y0[kGP], y1[kGP], n0w[kVN], n1w[kVN];
        split_pair<kGP>(yv[u][0], yv[u][1], y0);
        split_pair<kGP>(yv[u][2], yv[u][3], y1);
        split_pair<kVN>(nv[u][0], nv[u][1], n0w);
        split_pair<kVN>(nv[u][2], nv[u][3], n1w);
#pragma unroll
        for (int part = 0; part < kGP; ++part) {
          *reinterpret_cast<uint2*>(y_pl + part * S::kVPlane + r * kLdV + c4) = make_uint2(y0[part], y1[part]);
        }
#pragma unroll
        for (int part = 0; part < kVN; ++part) {
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
    next_dh.template load<kBeside>(dhn_c, 0);
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
      // The factors of the lane's two rows, then per column pair those of its two columns, read once.
      double G_row[2];
      float qs_row[2], rk_row[2], beta_row[2];  // scale·rstd_q, rstd_k, β
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        int const i = m0 + g + 8 * hf;
        G_row[hf] = G[i];
        qs_row[hf] = scale * rq[i];
        rk_row[hf] = rk[i];
        beta_row[hf] = beta_s[i];
      }
      double row_e[2] = {0.0, 0.0}, row_f[2] = {0.0, 0.0}, col_e[4][2];
#pragma unroll
      for (int jn = 0; jn < 4; ++jn) {
        col_e[jn][0] = col_e[jn][1] = 0.0;
        int const col = n0 + 8 * jn + 2 * t4;
        double G_col[2];
        float rk_col[2];
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          G_col[b] = G[col + b];
          rk_col[b] = rk[col + b];
        }
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          int const i = m0 + g + 8 * hf;
          float mq[2], mkk[2];
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            int const e = 2 * hf + b, cc = col + b;
            float const decay = cc <= i && i < len ? expf(float(G_row[hf] - G_col[b])) : 0.0f;
            float const P_ij = qs_row[hf] * rk_col[b] * sq[jn][e] * decay;
            float const A_ij = cc < i ? rk_row[hf] * rk_col[b] * sk[jn][e] * decay : 0.0f;
            float const dA = cc < i ? -d2[jn][e] : 0.0f;
            float const M1 = d1[jn][e] * decay, Bm = beta_row[hf] * dA * decay;
            float const E = d1[jn][e] * P_ij + dA * beta_row[hf] * A_ij;  // dP ⊙ P + dA ⊙ A
            row_e[hf] += E;
            row_f[hf] += dA * A_ij;
            col_e[jn][b] += E;
            mq[b] = M1 * rk_col[b];
            mkk[b] = Bm * rk_col[b];
            // the transposed coefficients: dk̂[cc] += M1[i][cc] q̂_i and Bm[i][cc] k̂_i
            __nv_bfloat16 wq[kGP], wk[kGP];
            split_one<kGP>(M1 * qs_row[hf], wq);
            split_one<kGP>(Bm * rk_row[hf], wk);
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
    // S3 = v_new dh_nextᵀ over the warp's 16 columns of the slab. The factors of the lane's two rows, read once.
    double hd = 0.0, last = 0.0, s_g[2] = {0.0, 0.0}, s_b[2] = {0.0, 0.0};
    StateRow rows[2];
    float q_row[2], k_row[2];  // scale·rstd_q and rstd_k
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      int const i = m0 + g + 8 * hf;
      rows[hf] = state_row(i, Gam, beta_s, s_end);
      q_row[hf] = scale * rq[i];
      k_row[hf] = rk[i];
    }
#pragma unroll
    for (int sb = 0; sb < K / kSlab; ++sb) {
      hd += double(next_h.dot(next_dh));  // the thread's share of the slab in fp32, then the head's sum in fp64
#pragma unroll
      for (int u = 0; u < decltype(next_h)::kPer; ++u) {  // the staged slab rows as planes
        int const at = decltype(next_h)::row(u) * S::kLdS + decltype(next_h)::col(u), below = 8 * S::kLdS;
        std::uint32_t h0[kGP], h1[kGP], d0w[kVN], d1w[kVN];
        split_pair<kGP>(next_h.v[u].x, next_h.v[u].y, h0);
        split_pair<kGP>(next_h.v[u].z, next_h.v[u].w, h1);
        split_pair<kVN>(next_dh.v[u].x, next_dh.v[u].y, d0w);
        split_pair<kVN>(next_dh.v[u].z, next_dh.v[u].w, d1w);
#pragma unroll
        for (int part = 0; part < kGP; ++part) {
          auto* const hp = reinterpret_cast<std::uint32_t*>(h_pl + part * S::kSlabPlane + at);
          hp[0] = h0[part];
          hp[below / 2] = h1[part];
        }
#pragma unroll
        for (int part = 0; part < kVN; ++part) {
          auto* const dp = reinterpret_cast<std::uint32_t*>(dh_pl + part * S::kSlabPlane + at);
          dp[0] = d0w[part];
          dp[below / 2] = d1w[part];
        }
      }
      __syncthreads();
      if (sb + 1 < K / kSlab) {
        next_h.load(h_c, sb + 1);
        next_dh.template load<kBeside>(dhn_c, sb + 1);
      }
      float s1[2][4] = {}, s2[2][4] = {}, s3[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < V / 16; ++ks) {
        std::uint32_t a_do[kPR][4], a_y[kGP][4], a_vn[kVN][4];
        load_a_rows<T, kPR>(do_tile, kLdV, m0, 16 * ks, lane, a_do);
        load_a_planes<kGP>(y_pl, S::kVPlane, kLdV, m0, 16 * ks, lane, a_y);
        load_a_planes<kVN>(vn_pl, S::kVPlane, kLdV, m0, 16 * ks, lane, a_vn);
        std::uint32_t bh0[kGP][2], bh1[kGP][2], bd0[kVN][2], bd1[kVN][2];
        load_b_planes_rows_x2<kGP>(h_pl, S::kSlabPlane, S::kLdS, 16 * ks, 16 * half_w, lane, bh0, bh1);
        load_b_planes_rows_x2<kVN>(dh_pl, S::kSlabPlane, S::kLdS, 16 * ks, 16 * half_w, lane, bd0, bd1);
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
        float2 qp[2], kp[2];  // q and k at the lane's two columns of tile u, rows m0 + g and m0 + g + 8
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          int const at = (m0 + g + 8 * hf) * kLdK + col0(2 * sb + u) + 2 * t4;
          qp[hf] = load_pair(q_tile + at);
          kp[hf] = load_pair(k_tile + at);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int const hf = e >> 1;
          float const qv = q_row[hf] * (e & 1 ? qp[hf].y : qp[hf].x), kv = k_row[hf] * (e & 1 ? kp[hf].y : kp[hf].x);
          fold_state_term(rows[hf], qv, kv, s1[u][e], s2[u][e], s3[u][e], dq[2 * sb + u][e], dk[2 * sb + u][e],
                          sg_f[hf], sb_f[hf], last_f);
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
    float2 const q = load_pair(q_tile + i * kLdK + col), k = load_pair(k_tile + i * kLdK + col);
    float const r_q = rq[i], r_k = rk[i];
    return float4{r_q * q.x, r_q * q.y, r_k * k.x, r_k * k.y};
  }, rq, rk, dot_s);
  if constexpr (kBeside) {
    if (blockIdx.x == gridDim.x - 1) grid_wait_prerequisites();  // this kernel ends after the recurrence
  }
}

}  // namespace fusepack::gated_delta_bwd_detail
