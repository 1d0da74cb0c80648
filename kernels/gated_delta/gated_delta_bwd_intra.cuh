// Backward stage 1 of the chunked gated delta rule, fp32 runs only (the forward of 16-bit runs saves what it
// computes, gated_delta_saves_intra, and their per-chunk kernel forms Â on its own tiles): gated_delta_bwd_intra, per
// (chunk, value head), P = q̂k̂ᵀ ⊙ decay (i >= j) and Â = k̂k̂ᵀ ⊙ decay (i > j) and the per-token record of row scales.
// Reads q, k, q_rstd, k_rstd, g, β; writes P as split-bf16 planes [NC, Hv, parts, 64, 64], Â [NC, Hv, 64, 64] fp32
// and the records [T, Hv, kBwdRecord] (GatedDeltaBwdRecord) into the workspace, for the two stages after it.
#pragma once

#include "kernels/gated_delta/gated_delta_bwd_common.cuh"

#include <cstddef>
#include <cstdint>

namespace fusepack::gated_delta_bwd_detail {

using namespace gated_delta_mma;

// Shared-memory layout: G in fp64, then (in fp32 elements) the q and k rows at pitch K + 4 and their row scales.
template <int K>
struct IntraSmem {
  static constexpr int kLd = K + 4;
  static constexpr int G = 0;  // fp64 [64], in doubles; the rest in floats
  static constexpr int q = 2 * kChunk, k = q + kChunk * kLd, rq = k + kChunk * kLd, rk = rq + kChunk,
                       floats = rk + kChunk;
};

// Dynamic shared memory (the fp64 array counted as two floats each).
template <int K>
constexpr std::size_t intra_smem_bytes() {
  return sizeof(float) * IntraSmem<K>::floats;
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
  GatedDeltaChunks const table = gated_delta_chunks(p);
  int const start = table.start(c), len = table.len(c);
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

}  // namespace fusepack::gated_delta_bwd_detail
