// Device code of the gated delta rule forward (its tile products are gated_delta_mma.cuh's): the WY-inverse kernel
// (per chunk: rstd, in-chunk cumsum of g, (I + A)^-1 by blocked forward substitution) and the chunk-recurrence kernel
// (per example, value head and value tile: sequential over chunks, state in fp32 registers). gated_delta_fwd.cu
// launches.
#pragma once

#include "kernels/common/vec.cuh"
#include "kernels/gated_delta/gated_delta.h"
#include "kernels/gated_delta/gated_delta_mma.cuh"
#include "kernels/gated_delta/gated_delta_trace.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fusepack::gated_delta_fwd_detail {

using namespace gated_delta_mma;

constexpr int kChunk = kGatedDeltaChunk;
static_assert(kChunk == 64, "the kernels tile a chunk as 4 × 16 rows and 8 × 8 columns");
constexpr float kL2NormEps = 1e-6f;
constexpr int kWyThreads = 256;    // WY-inverse kernel: 8 warps, four per value head

// Per (token, value head) the WY-inverse kernel writes one record of 8 fp32 that the recurrence reads whole:
enum Record : int {
  kRecA,      // e^{G_i} · rstd_k_i                 (X → Y: Y_i = β_i (v_i − kRecA · k_i·h))
  kRecBeta,   // β_i (beside kRecA: y_from_x reads the pair as one 8-byte word)
  kRecG,      // G_i, the inclusive cumsum of g within the chunk
  kRecC,      // scale · rstd_q_i · e^{G_i}          (o_i += kRecC · q_i·h)
  kRecD,      // rstd_k_i · e^{G_last − G_i}        (h_next += k_i ⊗ kRecD · v_new_i)
  kRecSq,     // scale · rstd_q_i
  kRecRk,     // rstd_k_i
  kRecDecay,  // e^{G_last} of the token's chunk
  kRecord
};

template <typename T>
__device__ __forceinline__ Vec16<T> zero16() {
  Vec16<T> r;
  *reinterpret_cast<int4*>(&r) = make_int4(0, 0, 0, 0);
  return r;
}

// P[i][j] = scale rstd_q_i rstd_k_j (q_i · k_j) e^{G_i − G_j} for j <= i < L, else 0, into the kOrder + 1 bf16
// planes [parts][64][kLdSq] at `planes`, from the chunk's q and k tiles ([64][ld] of T in shared memory) and its
// token records: 32 tiles of 16×8, shared among the block's kWarps warps (every warp must call). The 20 tiles on or
// below the diagonal blocks (column tile nt <= 2·mt + 1 of row block mt) take the products, dealt round-robin from
// the first warp; the 12 above them are zeros, dealt from the last warp, so that no warp forms more than
// ceil(20 / kWarps) tiles (a warp's tiles by row block would give the last warps all the full rows: 4 of 8 tiles'
// products at 8 warps, 8 at 4, and the block waits for its slowest warp).
template <typename T, int kK, int kWarps>
__device__ __forceinline__ void build_p_planes(T const* q_tile, T const* k_tile, int ld, float const* rec_tile,
                                               __nv_bfloat16* planes, int L, int warp, int lane) {
  using Pol = SplitPolicy<T>;
  constexpr int kPF = Pol::kOrder + 1, kPR = Pol::kRawParts;
  constexpr int kLower = 20, kUpper = 12;
  static_assert(32 % kWarps == 0, "the 32 tiles split evenly among the warps");
  int const g = lane >> 2, t = lane & 3;
  // One tile out: rows g and g + 8 of row block mt, columns 2t, 2t + 1 of column tile nt (acc zero: a zero tile).
  // The records of the lane's two columns are read once per tile and those of its two rows once each (rows and
  // columns past L hold zeros in the records, which the mask below leaves unused).
  auto const store = [&](int mt, int nt, float const (&acc)[4], bool scaled) {
    int const j = 8 * nt + 2 * t;
    float rk_j[2] = {0.0f, 0.0f}, G_j[2] = {0.0f, 0.0f};
    if (scaled) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        rk_j[c] = rec_tile[(j + c) * kRecord + kRecRk];
        G_j[c] = rec_tile[(j + c) * kRecord + kRecG];
      }
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      int const i = 16 * mt + g + 8 * hr;
      float val[2] = {0.0f, 0.0f};
      if (scaled) {
        float const sq_i = rec_tile[i * kRecord + kRecSq], G_i = rec_tile[i * kRecord + kRecG];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (j + c <= i && i < L) val[c] = sq_i * rk_j[c] * acc[2 * hr + c] * policy_exp<T>(G_i - G_j[c]);
        }
      }
      std::uint32_t w[kPF];
      split_pair<kPF>(val[0], val[1], w);
#pragma unroll
      for (int part = 0; part < kPF; ++part) {
        *reinterpret_cast<std::uint32_t*>(planes + part * kPlane + i * kLdSq + j) = w[part];
      }
    }
  };
#pragma unroll
  for (int u = 0; u < (kLower + kWarps - 1) / kWarps; ++u) {
    int const v = warp + kWarps * u;  // lower tile v: row block mt, column tile nt <= 2·mt + 1
    if (kLower % kWarps == 0 || v < kLower) {
      int const mt = v < 2 ? 0 : v < 6 ? 1 : v < 12 ? 2 : 3, nt = v - mt * (mt + 1);
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (8 * nt < L) {
#pragma unroll
        for (int ks = 0; ks < kK / 16; ++ks) {
          std::uint32_t a[kPR][4], b[kPR][2];
          load_a_rows<T, kPR>(q_tile, ld, 16 * mt, 16 * ks, lane, a);
          load_b_cols<T, kPR>(k_tile, ld, 8 * nt, 16 * ks, lane, b);
          mma_split<Pol::kOrder>(acc, a, b);
        }
      }
      store(mt, nt, acc, true);
    }
  }
#pragma unroll
  for (int u = 0; u < (kUpper + kWarps - 1) / kWarps; ++u) {
    int const z = kWarps - 1 - warp + kWarps * u;  // upper tile z: column tile nt > 2·mt + 1
    if (kUpper % kWarps == 0 || z < kUpper) {
      int const mt = z < 6 ? 0 : z < 10 ? 1 : 2, nt = mt == 0 ? 2 + z : mt == 1 ? z - 2 : z - 4;
      float const zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      store(mt, nt, zero, false);
    }
  }
}

// One chunk's inputs into a recurrence's stage by the block's kThreads threads (cp.async; the caller commits): the raw
// k rows of key head hk and, kWithQ, its q rows ([64][kK] of T, rows ldk bytes apart), value head hv's kBV value
// columns from v0 (rows ldv bytes apart), its (I + A)^-1 planes ([parts][64][kLdSq] bf16) and token records
// ([64][kRecord] fp32), for the chunk's rows [t0, t0 + L); rows at or past L as zeros. kUnrolled: copy_rows_async's.
template <typename T, int kK, int kBV, int kThreads, bool kWithQ, bool kUnrolled = false>
__device__ __forceinline__ void copy_chunk_inputs(GatedDeltaFwdParams const& p, float const* rec,
                                                  __nv_bfloat16 const* ainv_planes, std::int64_t t0, int L, int hk,
                                                  int hv, int v0, unsigned char* k_dst, unsigned char* q_dst, int ldk,
                                                  unsigned char* v_dst, int ldv, unsigned char* planes_dst,
                                                  unsigned char* rec_dst) {
  constexpr int kPF = SplitPolicy<T>::kOrder + 1, kRowT = int(sizeof(T)) * kK;
  int const Hk = p.Hk, Hv = p.Hv, V = p.V;
  std::int64_t const qk0 = (t0 * Hk + hk) * kK, qk_stride = sizeof(T) * std::int64_t(Hk) * kK;
  T const* const v = static_cast<T const*>(p.v);
  auto const copy = [&](int valid) {
    copy_rows_async<kChunk, kRowT, kThreads, kUnrolled>(k_dst, ldk, static_cast<T const*>(p.k) + qk0, qk_stride,
                                                        valid);
    if constexpr (kWithQ) {
      copy_rows_async<kChunk, kRowT, kThreads, kUnrolled>(q_dst, ldk, static_cast<T const*>(p.q) + qk0, qk_stride,
                                                          valid);
    }
    copy_rows_async<kChunk, int(sizeof(T)) * kBV, kThreads, kUnrolled>(v_dst, ldv, v + (t0 * Hv + hv) * V + v0,
                                                                       sizeof(T) * Hv * V, valid);
#pragma unroll
    for (int part = 0; part < kPF; ++part) {
      copy_rows_async<kChunk, 2 * kChunk, kThreads, kUnrolled>(planes_dst + 2 * part * kPlane, 2 * kLdSq,
                                                               ainv_planes + ((t0 * Hv + hv) * kPF + part) * kChunk,
                                                               2 * std::int64_t(Hv) * kPF * kChunk, valid);
    }
    copy_rows_async<kChunk, 4 * kRecord, kThreads, kUnrolled>(rec_dst, 4 * kRecord, rec + (t0 * Hv + hv) * kRecord,
                                                              4 * std::int64_t(Hv) * kRecord, valid);
  };
  copy_whole_or_guarded<kChunk, kUnrolled>(copy, L);
}

// Y_i = β_i (v_i − e^{G_i} rstd_k_i X_i) in place of X ([16 columns, 64 tokens] accumulator tiles of the warp), from
// the chunk's v tile (value columns from `col0`, rows ld apart) and its token records, each token's e^{G} rstd_k and β
// in one 8-byte read. 16-bit runs take v in the accumulator layout by transposed ldmatrix (of four 8 × 8 matrices,
// matrix m holds tokens 8·(2j + m/2).. and value columns col0 + 8·(m%2).., so a lane's word is tokens 2t and 2t + 1
// of its column g).
template <typename T>
__device__ __forceinline__ void y_from_x(float (&x)[8][4], T const* v_tile, int ld, int col0, float const* rec_tile,
                                         int lane) {
  static_assert(kRecA == 0 && kRecBeta == 1, "e^{G} rstd_k and β are the record's first 8 bytes");
  int const g = lane >> 2, t = lane & 3;
  auto const y = [&](float& xe, float v, float2 const& ab) { xe = ab.y * (v - ab.x * xe); };
  auto const rec_ab = [&](int i) { return *reinterpret_cast<float2 const*>(rec_tile + i * kRecord); };
  if constexpr (sizeof(T) == 2) {
    int const m = lane >> 3, r = lane & 7;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      std::uint32_t w[4];
      ldmatrix_x4_trans(w, v_tile + (16 * j + 8 * (m >> 1) + r) * ld + col0 + 8 * (m & 1));
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        int const nt = 2 * j + nb;
        float2 const r0 = rec_ab(8 * nt + 2 * t), r1 = rec_ab(8 * nt + 2 * t + 1);
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // value columns g and g + 8
          T pair[2];
          memcpy(pair, &w[2 * nb + half], sizeof(pair));
          y(x[nt][2 * half], to_float(pair[0]), r0);
          y(x[nt][2 * half + 1], to_float(pair[1]), r1);
        }
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int const i = 8 * nt + 2 * t + (e & 1);
        y(x[nt][e], v_tile[i * ld + col0 + g + 8 * (e >> 1)], rec_ab(i));
      }
    }
  }
}

// hᵀ ← e^{G_last} hᵀ + (rstd_k e^{G_last − G} ⊙ v_new)ᵀ k over the warp's state columns d0.. (kTiles accumulator
// tiles), with the raw k rows of the chunk (rows ld apart) as operand; vn is scaled in place. Token tiles at or past
// `rows` are skipped: the chunk's length L, or kChunk from a kernel with registers to spare (the k rows and records
// past L are zeros in shared memory, so those products add zeros; a guard makes the compiler recompute the operands'
// addresses behind it, which saves registers at the cost of instructions).
template <typename T, int kTiles>
__device__ __forceinline__ void update_state(float (&h)[kTiles][4], float (&vn)[8][4], T const* k_tile, int ld,
                                             float const* rec_tile, int d0, int rows, int lane) {
  using Pol = SplitPolicy<T>;
  constexpr int kPF = Pol::kOrder + 1, kPR = Pol::kRawParts;
  int const t = lane & 3;
  float const decay = rec_tile[kRecDecay];
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) h[nt][e] *= decay;
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) vn[nt][e] *= rec_tile[(8 * nt + 2 * t + (e & 1)) * kRecord + kRecD];
  }
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    if (16 * ks < rows) {
      std::uint32_t a[kPF][4];
      a_from_acc<kPF>(vn[2 * ks], vn[2 * ks + 1], a);
#pragma unroll
      for (int np = 0; np < kTiles / 2; ++np) {
        std::uint32_t b0[kPR][2], b1[kPR][2];
        load_b_rows_x2<T, kPR>(k_tile, ld, 16 * ks, d0 + 16 * np, lane, b0, b1);
        mma_split<Pol::kOrder>(h[2 * np], a, b0);
        mma_split<Pol::kOrder>(h[2 * np + 1], a, b1);
      }
    }
  }
}

// The P planes of one (chunk, value head) out to the saved P (p.P at [chunk · Hv + value head]) by the block's
// kThreads threads, in 16-bit runs only (gated_delta_saves_intra); fp32 runs save no P.
template <typename T, int kThreads>
__device__ __forceinline__ void save_p_planes(__nv_bfloat16 const* planes, std::uint16_t* saved_P,
                                              std::int64_t chunk_head, int tid) {
  if constexpr (!std::is_same_v<T, float>) {
    constexpr int kPF = SplitPolicy<T>::kOrder + 1;
    constexpr int kRowVecs = kChunk / 8;  // 16-byte vectors of bf16 per plane row
    __nv_bfloat16* const P_out = reinterpret_cast<__nv_bfloat16*>(saved_P) + chunk_head * kPF * kChunk * kChunk;
#pragma unroll
    for (int idx = tid; idx < kPF * kChunk * kRowVecs; idx += kThreads) {
      int const row = idx / kRowVecs, cv = idx % kRowVecs;  // row = part · 64 + i
      *reinterpret_cast<int4*>(P_out + row * kChunk + 8 * cv) =
          *reinterpret_cast<int4 const*>(planes + (row / kChunk) * kPlane + (row % kChunk) * kLdSq + 8 * cv);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Kernel 1, one block per (chunk, key head, pair of that key head's value heads): 8 warps, 4 per value head.

constexpr int kLdInv = kChunk + 4;  // row stride of the inversion's fp32 squares: the transposed stores of A from
                                    // accumulator tiles (rows 2t apart, columns g) land on 32 distinct banks

// A value head's fp32 square [64][kLdInv] holds, strictly above the diagonal, Aᵀ (square[j][i] = A[i][j], i > j:
// a row of it is a column of A) and on and below it X = (I + A)^-1 as its 16 × 16 blocks are solved. The two squares
// overlay the k tile, dead once Ŝ is in the warps' accumulators.
template <typename T, int kK>
struct WyInverseSmem {
  static constexpr int kLdK = kK + kLdPad;
  static constexpr std::size_t kKTileBytes = sizeof(T) * kChunk * kLdK;
  static constexpr std::size_t kSquareBytes = sizeof(float) * 2 * kChunk * kLdInv;
  static constexpr std::size_t kKTile = 0;   // T [64][kLdK]
  static constexpr std::size_t kSquare = 0;  // fp32 [2][64][kLdInv], after Ŝ
  static constexpr std::size_t kRstdK = align16(kKTileBytes > kSquareBytes ? kKTileBytes : kSquareBytes);  // [64]
  static constexpr std::size_t kSq = kRstdK + sizeof(float) * kChunk;    // fp32 [64]
  static constexpr std::size_t kG = kSq + sizeof(float) * kChunk;        // fp32 [2][64]
  static constexpr std::size_t kBeta = kG + sizeof(float) * 2 * kChunk;  // fp32 [2][64]
  static constexpr std::size_t kBytes = kBeta + sizeof(float) * 2 * kChunk;
};

// The inverse by 16 × 16 blocks, X_ij of rows 16i.., columns 16j.. (i >= j): the diagonal blocks
// X_ii = (I + A_ii)^-1 by forward substitution in fp32, then the blocks below them diagonal by diagonal,
// X_ij = −X_ii Σ_{k=j}^{i−1} A_ik X_kj, on the tensor cores over three bf16 parts per operand (fp32-level products,
// SplitPolicy<float>) in every run: as exact as the fp32 substitution over all 64 rows (CPU emulation,
// GatedDeltaChunked.BlockedInverseOnThreePartProductsIsAsExactAsSubstitution; two parts are not). Substitution by
// block rows would take a panel and a block step per block row, each behind a block barrier; by blocks the four
// diagonal blocks run at once, one warp each, and each diagonal below them is one step: 4 barriers instead of 10.

// Diagonal block kI = hw of the value head's square (warp hw), one lane per column c = lane < 16, column-ordered
// (x_j final, then every later row takes its A[·][j] term): a dependent path of 16 fmaf. The lanes read Aᵀ in the
// block's rows above the diagonal and store X on and below it, in the same rows: the warp's reads end before its
// stores start (__syncwarp), and no other warp touches the block in this phase.
__device__ __forceinline__ void wy_diagonal(float* square, int hw, int lane) {
  int const base = 16 * hw, c = lane;
  float x[16];
  if (c < 16) {
#pragma unroll
    for (int r = 0; r < 16; ++r) x[r] = r == c ? 1.0f : 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float const xj = x[j];
#pragma unroll
      for (int q4 = (j + 1) / 4; q4 < 4; ++q4) {
        float4 const a4 = *reinterpret_cast<float4 const*>(square + (base + j) * kLdInv + base + 4 * q4);
        float const a[4] = {a4.x, a4.y, a4.z, a4.w};  // A[base + 4·q4 + u][base + j]
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (4 * q4 + u > j) x[4 * q4 + u] = fmaf(-a[u], xj, x[4 * q4 + u]);
        }
      }
    }
  }
  __syncwarp();
  if (c < 16) {
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      if (c <= r) square[(base + r) * kLdInv + base + c] = x[r];
    }
  }
}

// Element x[e] of an A fragment (rows m0.., k columns k0..; a_from_floats' order) lies at row m0 + g + 8·(e / 2 % 2),
// column k0 + 2t + e % 2 + 8·(e / 4).
__device__ __forceinline__ int wy_frag_row(int lane, int e) { return (lane >> 2) + 8 * ((e >> 1) & 1); }
__device__ __forceinline__ int wy_frag_col(int lane, int e) { return 2 * (lane & 3) + (e & 1) + 8 * (e >> 2); }

// Block (i, j) = (hw + kD, hw) of the kD-th diagonal below the diagonal blocks (warps hw < 4 − kD), transposed so
// that the inner sum lands in the layout of the outer product's A operand:
//   Cᵀ = Σ_{k=j}^{i−1} X_kjᵀ A_ikᵀ  (A: X_kj read transposed, zero above the diagonal of X_jj; B: Aᵀ's rows),
//   X_ijᵀ = −Cᵀ X_iiᵀ               (A: Cᵀ from the accumulators; B: X_ii's rows, zero above its diagonal),
// stored transposed back into the block. Every block it reads was stored before the last barrier; the block it
// writes is read by no warp in this phase.
template <int kD>
__device__ __forceinline__ void wy_below_diagonal(float* square, int hw, int lane) {
  constexpr int kP = SplitPolicy<float>::kRawParts, kOrder = SplitPolicy<float>::kOrder;
  int const j = hw, i = hw + kD;
  float ct[2][4] = {};
#pragma unroll 1
  for (int k = j; k < i; ++k) {
    float xa[8];
    load_a_trans_floats(square, kLdInv, 16 * j, 16 * k, lane, xa);  // X_kjᵀ[m][kk] = square[16k + kk][16j + m]
    if (k == j) {
#pragma unroll
      for (int e = 0; e < 8; ++e) xa[e] = wy_frag_row(lane, e) > wy_frag_col(lane, e) ? 0.0f : xa[e];
    }
    std::uint32_t a[kP][4], b0[kP][2], b1[kP][2];
    a_from_floats<kP>(xa, a);
    load_b_rows_x2<float, kP>(square, kLdInv, 16 * k, 16 * i, lane, b0, b1);  // B[kk][n] = A[16i + n][16k + kk]
    mma_split<kOrder>(ct[0], a, b0);
    mma_split<kOrder>(ct[1], a, b1);
  }
  std::uint32_t a[kP][4];
  {
    float const x[8] = {-ct[0][0], -ct[0][1], -ct[0][2], -ct[0][3], -ct[1][0], -ct[1][1], -ct[1][2], -ct[1][3]};
    a_from_floats<kP>(x, a);
  }
  int const g = lane >> 2, t = lane & 3;
  float xt[2][4] = {};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    // B[kk][n] = X_ii[n][kk], n = 8·nt + g, kk = 2t (+1, +8, +9); zero where kk > n (Aᵀ is stored there)
    int const n = 8 * nt + g;
    float const* row = square + (16 * i + n) * kLdInv + 16 * i;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int const kk = 2 * t + (e & 1) + 8 * (e >> 1);
      v[e] = kk > n ? 0.0f : row[kk];
    }
    std::uint32_t w[2][kP], b[kP][2];
    split_pair<kP>(v[0], v[1], w[0]);
    split_pair<kP>(v[2], v[3], w[1]);
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      b[p][0] = w[0][p];
      b[p][1] = w[1][p];
    }
    mma_split<kOrder>(xt[nt], a, b);
  }
  // xt[nt][e] = X_ijᵀ[g + 8·(e / 2)][8·nt + 2t + e % 2] = X_ij[8·nt + 2t + e % 2][g + 8·(e / 2)]
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int const r = 8 * nt + 2 * t + (e & 1), cc = g + 8 * (e >> 1);
      square[(16 * i + r) * kLdInv + 16 * j + cc] = xt[nt][e];
    }
  }
}

// The Ŝ tile pairs (row block mb, column tiles 2np and 2np + 1, np <= mb: 10 pairs, the 20 tiles on and below the
// diagonal 16×16 blocks) of the WY kernel's warp w: pair 0, and for warps 0 and 1 pair 1, the diagonal pair of pair
// 0's row block (mb = -1: none). So a warp loads the fragments of at most two row blocks per k step.
// Pair 0 of warp w in bits 4w..4w+3, as mb(mb + 1)/2 + np: (3,0) (2,1) (3,1) (3,2) (2,0) (1,0) (1,1) (0,0).
constexpr unsigned kWyFirstPairs = 0x02138746u;
struct WyPair {
  int mb, np;
};
__host__ __device__ constexpr WyPair wy_pair(int warp, int u) {
  int const idx = static_cast<int>((kWyFirstPairs >> (4 * warp)) & 15u);
  int const mb = idx < 1 ? 0 : idx < 3 ? 1 : idx < 6 ? 2 : 3;
  if (u == 0) return {mb, idx - mb * (mb + 1) / 2};
  return warp < 2 ? WyPair{mb, mb} : WyPair{-1, -1};
}
// Every pair is formed by exactly one warp (a table that repeats one leaves another's A entries unwritten).
constexpr bool wy_pairs_cover_each_once() {
  int seen[10] = {};
  for (int w = 0; w < kWyThreads / 32; ++w) {
    for (int u = 0; u < 2; ++u) {
      WyPair const q = wy_pair(w, u);
      if (q.mb < 0) continue;
      if (q.np < 0 || q.np > q.mb || q.mb > 3) return false;
      ++seen[q.mb * (q.mb + 1) / 2 + q.np];
    }
  }
  for (int count : seen) {
    if (count != 1) return false;
  }
  return true;
}
static_assert(wy_pairs_cover_each_once(), "the WY kernel's warps form each pair of column tiles of k k^T once");

// The B fragments of column tiles 2np and 2np + 1 of k kᵀ (B = kᵀ) from the A fragment of row block np of the k tile:
// rows 16np + g and 16np + 8 + g, the words load_b_cols would load for those tiles.
template <int P>
__device__ __forceinline__ void wy_b_halves(std::uint32_t const (&a)[P][4], std::uint32_t (&b)[2][P][2]) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    b[0][i][0] = a[i][0];
    b[0][i][1] = a[i][2];
    b[1][i][0] = a[i][1];
    b[1][i][1] = a[i][3];
  }
}

// Per chunk c and key head: q_rstd, k_rstd, Ŝ = rstd_k_i rstd_k_j (k_i · k_j) (tensor cores, kept in the
// accumulators); per value head (warps 0-3 and 4-7 each take one): G = cumsum(g) in the chunk, the token records,
// A[i][j] = β_i Ŝ[i][j] e^{G_i − G_j} (i > j) and (I + A)^-1 (by blocks, above) as bf16 parts into ainv_planes
// ([T, Hv, parts, 64], row = token; p.Ainv when p.save, for the backward). Rows past the chunk are not written: the
// readers fill them with zeros.
// 8 warps, ~36 KB of shared memory and 64 registers per thread in 16-bit runs (the bound, met without spilling) let 4
// blocks share a multiprocessor (fp32 runs 2): the kernel is a chain of short dependent steps (loads, cumsum, the Ŝ
// tiles, 4 inversion phases), hidden by the other blocks' work; shared memory is its busiest pipe (Nsight Compute:
// L1 74% of peak, issue 62%), so each phase reads what it needs once.
template <typename T, int kK>
__global__ void __launch_bounds__(kWyThreads, sizeof(T) < 4 ? 4 : 1)
    gated_delta_fwd_wy_inverse(GatedDeltaFwdParams p, float* rec, __nv_bfloat16* ainv_planes) {
  using Sm = WyInverseSmem<T, kK>;
  using Pol = SplitPolicy<T>;
  constexpr int kP = Pol::kRawParts, kPF = Pol::kOrder + 1;
  extern __shared__ __align__(16) unsigned char gd_smem[];
  T* k_tile = reinterpret_cast<T*>(gd_smem + Sm::kKTile);
  float* rstd_k = reinterpret_cast<float*>(gd_smem + Sm::kRstdK);
  float* sq = reinterpret_cast<float*>(gd_smem + Sm::kSq);
  float* G_all = reinterpret_cast<float*>(gd_smem + Sm::kG);
  float* beta_all = reinterpret_cast<float*>(gd_smem + Sm::kBeta);

  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kWyStart);
  int const Hk = p.Hk, Hv = p.Hv, group = Hv / Hk, pairs = (group + 1) / 2;
  unsigned bid = blockIdx.x;  // 32-bit: the launcher keeps the grid below 2^31 blocks
  int const pair = static_cast<int>(bid % static_cast<unsigned>(pairs));
  bid /= static_cast<unsigned>(pairs);
  int const hk = static_cast<int>(bid % static_cast<unsigned>(Hk));
  int const c = static_cast<int>(bid / static_cast<unsigned>(Hk));
  GatedDeltaChunks const table = gated_delta_chunks(p);
  std::int64_t const start = table.start(c);
  int const L = table.len(c);

  // q and k rows, 16 bytes per thread per step, all in flight before the first use, with g and β of both value
  // heads; a row's sum of squares reduces over the kVecs lanes that hold it.
  {
    constexpr int kVecN = 16 / sizeof(T), kVecs = kK / kVecN, kIters = kChunk * kVecs / kWyThreads;
    static_assert(kVecs <= 32 && 32 % kVecs == 0, "a row's vectors must sit in one warp");
    static_assert(kChunk * kVecs % kWyThreads == 0 && 2 * kChunk <= kWyThreads, "one pass of whole steps");
    auto const* q = static_cast<T const*>(p.q);
    auto const* k = static_cast<T const*>(p.k);
    Vec16<T> qv[kIters], kv[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      int const idx = tid + it * kWyThreads, r = idx / kVecs, cv = idx % kVecs;
      qv[it] = zero16<T>();
      kv[it] = zero16<T>();
      if (r < L) {
        std::int64_t const off = ((start + r) * Hk + hk) * kK + cv * kVecN;
        qv[it] = load16(q + off);
        kv[it] = load16(k + off);
      }
    }
    if (tid < 2 * kChunk) {
      int const i = tid & (kChunk - 1), hv_local = 2 * pair + tid / kChunk;
      float gi = 0.0f, bi = 0.0f;
      if (hv_local < group && i < L) {
        std::int64_t const off = (start + i) * Hv + hk * group + hv_local;
        gi = p.g[off];
        bi = to_float(static_cast<T const*>(p.beta)[off]);
      }
      G_all[tid] = gi;
      beta_all[tid] = bi;
    }
    // The kIters rows' sums, reductions and rstds as independent chains (no branch between them), then the stores.
    float ssq[kIters], ssk[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      int const idx = tid + it * kWyThreads, r = idx / kVecs, cv = idx % kVecs;
      store16(k_tile + r * Sm::kLdK + cv * kVecN, kv[it]);
      ssq[it] = 0.0f;
      ssk[it] = 0.0f;
#pragma unroll
      for (int e = 0; e < kVecN; ++e) {
        float const qe = to_float(qv[it].v[e]), ke = to_float(kv[it].v[e]);
        ssq[it] = fmaf(qe, qe, ssq[it]);
        ssk[it] = fmaf(ke, ke, ssk[it]);
      }
    }
#pragma unroll
    for (int off = kVecs / 2; off > 0; off /= 2) {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        ssq[it] += __shfl_xor_sync(0xffffffffu, ssq[it], off);
        ssk[it] += __shfl_xor_sync(0xffffffffu, ssk[it], off);
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      int const idx = tid + it * kWyThreads, r = idx / kVecs, cv = idx % kVecs;
      // every lane of the row holds its sum: all compute (rows past the chunk: 0, so nothing there is ever scaled
      // up), the row's first lane stores
      float rq = 0.0f, rk = 0.0f;
      if (r < L) {
        rq = p.use_qk_l2norm ? 1.0f / sqrtf(ssq[it] + kL2NormEps) : 1.0f;
        rk = p.use_qk_l2norm ? 1.0f / sqrtf(ssk[it] + kL2NormEps) : 1.0f;
      }
      if (cv == 0) {
        if (r < L && p.save && pair == 0) {
          p.q_rstd[(start + r) * Hk + hk] = rq;
          p.k_rstd[(start + r) * Hk + hk] = rk;
        }
        rstd_k[r] = rk;
        sq[r] = p.scale * rq;
      }
    }
  }
  __syncthreads();

  // 16-bit runs in training also save the backward's records and P (the recurrence; gated_delta_saves_intra)
  bool const save_intra = p.save && !std::is_same_v<T, float>;
  static_assert(kBwdRecord >= 8, "the backward record is written as two float4");
  int const slot = warp >> 2, hw = warp & 3, hv_local = 2 * pair + slot;
  bool const active = hv_local < group;  // an odd group leaves the last block's second value head idle
  int const hv = hk * group + hv_local;

  // G by a sequential fp32 cumsum: a tree scan rounds neighbouring partial sums along different paths, and the
  // differences G_i − G_j that the kernels exponentiate then carry several ulps of |G| (~3× the error of plain fp32
  // in emulation at |G| ≈ 45) instead of one. One lane per value head, in warps 6 and 7, which have fewer Ŝ tiles.
  if (warp >= 6 && lane == 0 && (2 * pair + warp - 6) < group) {
    float4* G4 = reinterpret_cast<float4*>(G_all + (warp - 6) * kChunk);
    float run = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunk / 4; ++i) {
      float4 v4 = G4[i];
      v4.x = i == 0 ? v4.x : run + v4.x;  // G_0 = g_0 as it is (a sign of zero included)
      v4.y += v4.x;
      v4.z += v4.y;
      v4.w += v4.z;
      run = v4.w;
      G4[i] = v4;
    }
  }

  // Ŝ on the m16n8 tiles on and below the diagonal 16×16 blocks, by pairs of column tiles (wy_pair), the
  // B fragments taken from A fragments (wy_b_halves). Each tile accumulates over K in the same order as a full-row
  // product would; row blocks past the chunk are zero and skipped.
  float acc[2][2][4] = {};  // [pair][column tile]
  WyPair const tile_pairs[2] = {wy_pair(warp, 0), wy_pair(warp, 1)};
  if (16 * tile_pairs[0].mb < L) {  // pair 1, when there is one, shares the row block
#pragma unroll
    for (int ks = 0; ks < kK / 16; ++ks) {
      std::uint32_t a[kP][4], an[kP][4], b[2][kP][2];
      load_a_rows<T, kP>(k_tile, Sm::kLdK, 16 * tile_pairs[0].mb, 16 * ks, lane, a);
      if (tile_pairs[0].np == tile_pairs[0].mb) {
#pragma unroll
        for (int i = 0; i < kP; ++i) {
#pragma unroll
          for (int r = 0; r < 4; ++r) an[i][r] = a[i][r];
        }
      } else {
        load_a_rows<T, kP>(k_tile, Sm::kLdK, 16 * tile_pairs[0].np, 16 * ks, lane, an);
      }
      wy_b_halves<kP>(an, b);
      mma_split<Pol::kOrder>(acc[0][0], a, b[0]);
      mma_split<Pol::kOrder>(acc[0][1], a, b[1]);
      if (tile_pairs[1].mb >= 0) {
        wy_b_halves<kP>(a, b);
        mma_split<Pol::kOrder>(acc[1][0], a, b[0]);
        mma_split<Pol::kOrder>(acc[1][1], a, b[1]);
      }
    }
  }
  __syncthreads();  // the k tile is dead (the squares overlay it); G is complete

  if (tid < 2 * kChunk && 2 * pair + tid / kChunk < group) {
    int const ts = tid & (kChunk - 1), h = tid / kChunk, hv_t = hk * group + 2 * pair + h;
    if (ts < L) {
      float const* G = G_all + h * kChunk;
      float const Gi = G[ts], GL = G[L - 1], rk = rstd_k[ts], sqi = sq[ts];
      float const eG = policy_exp<T>(Gi);
      float r[kRecord];
      r[kRecG] = Gi;
      r[kRecBeta] = beta_all[h * kChunk + ts];
      r[kRecA] = eG * rk;
      r[kRecC] = sqi * eG;
      r[kRecD] = rk * policy_exp<T>(GL - Gi);
      r[kRecSq] = sqi;
      r[kRecRk] = rk;
      r[kRecDecay] = policy_exp<T>(GL);
      float4* dst = reinterpret_cast<float4*>(rec + ((start + ts) * Hv + hv_t) * kRecord);
      dst[0] = make_float4(r[0], r[1], r[2], r[3]);
      dst[1] = make_float4(r[4], r[5], r[6], r[7]);
      if (save_intra) {  // the same scales in the backward recurrence's record (GatedDeltaBwdRecord)
        float4* bdst = reinterpret_cast<float4*>(p.brec + ((start + ts) * Hv + hv_t) * kBwdRecord);
        bdst[0] = make_float4(r[kRecC], r[kRecD], -r[kRecBeta] * r[kRecA], r[kRecBeta]);
        bdst[1] = make_float4(r[kRecDecay], 0.0f, 0.0f, 0.0f);
      }
    }
  }

  // A of both value heads from the Ŝ tiles, transposed into the squares (rows past the chunk: 0). exp(G_i − G_j)
  // only for j < i < L: a difference of two partial sums of one chunk, never e^{G_i}·e^{−G_j}. A tile's two rows
  // and two columns are read once for its four elements.
  {
    int const g = lane >> 2, t = lane & 3;
    bool const second = 2 * pair + 1 < group;  // the block's second value head (the first always exists)
#pragma unroll
    for (int tile = 0; tile < 4; ++tile) {
      int const u = tile >> 1, mb = tile_pairs[u].mb, nt = 2 * tile_pairs[u].np + (tile & 1);
      if (mb >= 0) {
        int const i0 = 16 * mb + g, j0 = 8 * nt + 2 * t;  // rows i0, i0 + 8; columns j0, j0 + 1
        float const(&tile_acc)[4] = acc[u][tile & 1];
        float const rki[2] = {rstd_k[i0], rstd_k[i0 + 8]}, rkj[2] = {rstd_k[j0], rstd_k[j0 + 1]};
        float s[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) s[e] = rki[e >> 1] * rkj[e & 1] * tile_acc[e];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (h == 0 || second) {
            float const* G = G_all + h * kChunk;
            float const Gi[2] = {G[i0], G[i0 + 8]}, Gj[2] = {G[j0], G[j0 + 1]};
            float const bi[2] = {beta_all[h * kChunk + i0], beta_all[h * kChunk + i0 + 8]};
            float a[4];  // every element first, without branches (the exponent masked), then the stores below i
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              int const i = i0 + 8 * (e >> 1), j = j0 + (e & 1);
              float const decay = policy_exp<T>(j < i ? Gi[e >> 1] - Gj[e & 1] : 0.0f);
              a[e] = bi[e >> 1] * s[e] * decay;
              a[e] = i < L ? a[e] : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              int const i = i0 + 8 * (e >> 1), j = j0 + (e & 1);
              if (j < i) reinterpret_cast<float*>(gd_smem + Sm::kSquare)[(h * kChunk + j) * kLdInv + i] = a[e];
            }
          }
        }
      }
    }
  }
  __syncthreads();

  // Block rows past the chunk feed no row below L: skipped (L is the same for the whole block). A block (i, j) with
  // rows past L is still solved where its first row is within L: those rows of A are zero, so X holds identity rows
  // on the diagonal and zero rows below it there, which no stored row reads.
  float* square = reinterpret_cast<float*>(gd_smem + Sm::kSquare) + slot * kChunk * kLdInv;
  if (active && 16 * hw < L) wy_diagonal(square, hw, lane);
  __syncthreads();
  if (16 < L) {
    if (active && hw < 3 && 16 * (hw + 1) < L) wy_below_diagonal<1>(square, hw, lane);
    __syncthreads();
  }
  if (32 < L) {
    if (active && hw < 2 && 16 * (hw + 2) < L) wy_below_diagonal<2>(square, hw, lane);
    __syncthreads();
  }
  if (48 < L) {
    if (active && hw < 1) wy_below_diagonal<3>(square, hw, lane);
    __syncthreads();
  }

  // Rows i < L out, 8 columns per thread: X on and below the diagonal, zeros above it (where the square holds Aᵀ).
  // A thread keeps its 8 columns and steps down by kRowStep rows.
  if (active) {
    constexpr int kGroups = kChunk / 8, kRowStep = (kWyThreads / 2) / kGroups, kItems = kChunk / kRowStep;
    std::int64_t const row_elems = std::int64_t(Hv) * kPF * kChunk;  // one token row of every value head's planes
    int const c0 = 8 * (tid % kGroups), i0 = (tid & (kWyThreads / 2 - 1)) / kGroups;
    __nv_bfloat16* dst = ainv_planes + (start * Hv + hv) * kPF * kChunk + i0 * row_elems + c0;
#pragma unroll
    for (int it = 0; it < kItems; ++it) {
      int const i = i0 + kRowStep * it;
      if (i < L) {
        float4 const lo = *reinterpret_cast<float4 const*>(square + i * kLdInv + c0);
        float4 const hi = *reinterpret_cast<float4 const*>(square + i * kLdInv + c0 + 4);
        float const xs[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        std::uint32_t w[4][kPF];
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          split_pair<kPF>(c0 + e <= i ? xs[e] : 0.0f, c0 + e + 1 <= i ? xs[e + 1] : 0.0f, w[e / 2]);
        }
#pragma unroll
        for (int part = 0; part < kPF; ++part) {
          *reinterpret_cast<int4*>(dst + kRowStep * it * row_elems + part * kChunk) =
              make_int4(static_cast<int>(w[0][part]), static_cast<int>(w[1][part]), static_cast<int>(w[2][part]),
                        static_cast<int>(w[3][part]));
        }
      }
    }
  }
  if constexpr (gated_delta_trace_detail::kTraced) {
    __syncthreads();  // every thread's stores issued
    if (tid == 0) gated_delta_trace_detail::trace_event(GatedDeltaTraceKind::kWyEnd);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Kernel 2, one block per (example, value head, tile of 16·kWarps/kKSplit value columns). The block's warps form
// slabs of kKSplit warps; a slab owns 16 value columns and keeps the transposed state hᵀ [16, K] of its columns in
// fp32 registers as accumulator tiles, each of its warps holding K/kKSplit of the K columns. kKSplit = 2 halves each
// warp's share of a chunk (for few, long examples, where the chunk-to-chunk chain is the whole time): the two warps
// add their halves of (k h)ᵀ and (q h)ᵀ through shared memory; the first computes v_new, the second o, and both
// update their half of the state.

template <typename T, int kK, int kWarps, int kKSplit>
struct RecurrenceSmem {
  static constexpr int kParts = SplitPolicy<T>::kOrder + 1;  // bf16 planes of Ainv and P
  static constexpr int kSlabs = kWarps / kKSplit;
  static constexpr int kBV = 16 * kSlabs;
  static constexpr int kLdK = kK + kLdPad;
  static constexpr int kLdV = kBV + kLdPad;
  static constexpr int kTileFloats = 16 * kChunk;  // one [16 columns, 64 tokens] accumulator tile set of a warp
  static constexpr std::size_t kKTile = 0;                                           // T [64][kLdK]
  static constexpr std::size_t kQTile = kKTile + sizeof(T) * kChunk * kLdK;         // T [64][kLdK]
  static constexpr std::size_t kVTile = kQTile + sizeof(T) * kChunk * kLdK;         // T [64][kLdV]: v, then o
  static constexpr std::size_t kPlanes = align16(kVTile + sizeof(T) * kChunk * kLdV);  // bf16 [parts][64][kLdSq]:
                                                                                     // Ainv, then P
  static constexpr std::size_t kRec = kPlanes + 2 * kParts * kPlane;               // fp32 [64][kRecord]
  static constexpr std::size_t kStage = kRec + sizeof(float) * kChunk * kRecord;   // one chunk's inputs
  static constexpr std::size_t kExchange = 2 * kStage;  // kKSplit = 2: fp32 [slabs][3][kTileFloats] (X, Z, v_new)
  static_assert(kExchange % 16 == 0, "the exchange is read and written in 16-byte words");
  static constexpr std::size_t kBytes = kExchange + (kKSplit == 2 ? sizeof(float) * kSlabs * 3 * kTileFloats : 0);
};

// Per chunk, with h the state entering it (k, q, v rows of the chunk; X, Z, Y, v_new, o as [16 columns, 64 tokens]
// accumulator tiles of each warp):
//   X = (k h)ᵀ, Z = (q h)ᵀ; Y_i = β_i (v_i − e^{G_i} rstd_k_i X_i); v_new = Ainv Y;
//   o = scale rstd_q e^{G} (q h) + P v_new, P[i][j] = scale rstd_q_i rstd_k_j (q_i·k_j) e^{G_i − G_j} (j <= i);
//   hᵀ ← e^{G_last} hᵀ + (rstd_k e^{G_last − G} ⊙ v_new)ᵀ k.
// The next chunk's inputs stream into the other stage (cp.async) while this one computes.
template <typename T, int kK, int kWarps, int kKSplit>
__global__ void __launch_bounds__(kWarps * 32, 1)
    gated_delta_fwd_chunk_recurrence(GatedDeltaFwdParams p, float const* rec, __nv_bfloat16 const* ainv_planes) {
  using Sm = RecurrenceSmem<T, kK, kWarps, kKSplit>;
  using Pol = SplitPolicy<T>;
  static_assert(kKSplit == 1 || kKSplit == 2, "a slab is one or two warps");
  constexpr int kThreads = kWarps * 32, kBV = Sm::kBV, kKW = kK / kKSplit;  // state columns of a warp
  constexpr int kStateTiles = kKW / 8;
  constexpr int kPF = Pol::kOrder + 1, kPR = Pol::kRawParts;  // parts of an fp32 operand, of an input element
  constexpr int kVecN = 16 / sizeof(T);
  extern __shared__ __align__(16) unsigned char gd_smem[];

  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  int const slab = warp / kKSplit, kh = warp % kKSplit;
  bool const does_v_new = kh == 0, does_o = kh == kKSplit - 1;  // the same warp when kKSplit = 1
  int const Hk = p.Hk, Hv = p.Hv, V = p.V, tiles = V / kBV;
  GatedDeltaChunks::ChainBlock const block = gated_delta_chunks(p).chain_block(blockIdx.x, Hv, tiles);
  int const vtile = block.tile, hv = block.head, n = block.example;  // longest example first
  int const hk = hv / (Hv / Hk);
  int const v0 = vtile * kBV;  // first value column of the block
  int const wc = 16 * slab;    // the slab's columns within the block's tile
  int const d0 = kh * kKW;     // the warp's first state column (key dimension)
  std::int64_t const bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];
  int const chunks = static_cast<int>((eos - bos + kChunk - 1) / kChunk);
  int const chunk0 = gated_delta_chunks(p).first_chunk(n);
  auto* o = static_cast<T*>(p.o);
  float* exchange = reinterpret_cast<float*>(gd_smem + Sm::kExchange) + slab * 3 * Sm::kTileFloats;

  // hᵀ[v0 + wc + g + 8·(e>>1)][d0 + 8·nt + 2t + (e&1)] in h[nt][e]; state tensors are [.., K, V].
  float h[kStateTiles][4];
  std::int64_t const state_off = (std::int64_t(n) * Hv + hv) * kK * V + v0 + wc + g;
  load_state_slab(h, p.initial_state, state_off, d0, V, t);

  // Chunk `it` of the example into stage s: q, k rows, the block's v columns, Ainv planes and records (zeros past L).
  auto issue = [&](int it, int s) {
    unsigned char* base = gd_smem + s * Sm::kStage;
    std::int64_t const t0 = bos + std::int64_t(it) * kChunk;
    int const L = static_cast<int>(eos - t0 < kChunk ? eos - t0 : kChunk);
    copy_chunk_inputs<T, kK, kBV, kThreads, true>(p, rec, ainv_planes, t0, L, hk, hv, v0, base + Sm::kKTile,
                                                  base + Sm::kQTile, int(sizeof(T)) * Sm::kLdK, base + Sm::kVTile,
                                                  int(sizeof(T)) * Sm::kLdV, base + Sm::kPlanes, base + Sm::kRec);
  };

  if (chunks > 0) issue(0, 0);
  cp_async_commit();
  for (int it = 0; it < chunks; ++it) {
    int const s = it & 1;
    cp_async_wait_all();
    __syncthreads();  // stage s has landed for every thread; every read of stage s^1 (the previous chunk) is done
    if (it + 1 < chunks) issue(it + 1, s ^ 1);
    cp_async_commit();

    unsigned char* base = gd_smem + s * Sm::kStage;
    T const* k_tile = reinterpret_cast<T const*>(base + Sm::kKTile);
    T const* q_tile = reinterpret_cast<T const*>(base + Sm::kQTile);
    T* v_tile = reinterpret_cast<T*>(base + Sm::kVTile);
    __nv_bfloat16* planes = reinterpret_cast<__nv_bfloat16*>(base + Sm::kPlanes);
    float const* rec_tile = reinterpret_cast<float const*>(base + Sm::kRec);
    std::int64_t const t0 = bos + std::int64_t(it) * kChunk;
    int const L = static_cast<int>(eos - t0 < kChunk ? eos - t0 : kChunk);

    // X = (k h)ᵀ and Z = (q h)ᵀ over the warp's state columns: A = the state slab, B = the raw k / q rows; token
    // tiles past L are all zero. When saving, the state entering the chunk goes out on the way, hᵀ [V][K] in tile
    // order (state_tile): one 16-byte store per tile, two per k-step, among the products rather than in one burst.
    float* const h_out = p.h + (std::int64_t(chunk0 + it) * Hv + hv) * V * kK +
                         state_tile(kK, (v0 + wc) / 16, d0 / 8) + 4 * lane;
    float x[8][4] = {}, z[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKW / 16; ++ks) {
      if (p.save) {
#pragma unroll
        for (int nt = 2 * ks; nt < 2 * ks + 2; ++nt) {
          *reinterpret_cast<float4*>(h_out + state_tile(kK, 0, nt)) =
              make_float4(h[nt][0], h[nt][1], h[nt][2], h[nt][3]);
        }
      }
      std::uint32_t a[kPF][4];
      a_from_acc<kPF>(h[2 * ks], h[2 * ks + 1], a);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (16 * np < L) {
          std::uint32_t b0[kPR][2], b1[kPR][2];
          load_b_cols_x2<T, kPR>(k_tile, Sm::kLdK, 16 * np, d0 + 16 * ks, lane, b0, b1);
          mma_split<Pol::kOrder>(x[2 * np], a, b0);
          mma_split<Pol::kOrder>(x[2 * np + 1], a, b1);
          load_b_cols_x2<T, kPR>(q_tile, Sm::kLdK, 16 * np, d0 + 16 * ks, lane, b0, b1);
          mma_split<Pol::kOrder>(z[2 * np], a, b0);
          mma_split<Pol::kOrder>(z[2 * np + 1], a, b1);
        }
      }
    }
    if constexpr (kKSplit == 2) {  // X to the first warp of the slab, Z to the second: X = X_0 + X_1, Z = Z_0 + Z_1
      if (does_v_new) {
        tiles_to_exchange(z, exchange + Sm::kTileFloats, lane);
      } else {
        tiles_to_exchange(x, exchange, lane);
      }
      __syncthreads();
      if (does_v_new) {
        tiles_add_from_exchange(x, exchange, lane);
      } else {
        tiles_add_from_exchange(z, exchange + Sm::kTileFloats, lane);
      }
    }

    // Y_i = β_i (v_i − e^{G_i} rstd_k_i X_i) in place of X; v_new = Ainv Y, i.e. v_newᵀ = Yᵀ Ainvᵀ.
    float vn[8][4] = {};
    auto* const vn_out = p.v_new + (t0 * Hv + hv) * V + v0 + wc;  // when saving
    if (does_v_new) {
      y_from_x(x, v_tile, Sm::kLdV, wc, rec_tile, lane);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        std::uint32_t a[kPF][4];
        a_from_acc<kPF>(x[2 * ks], x[2 * ks + 1], a);
#pragma unroll
        for (int np = ks; np < 4; ++np) {  // Ainv is lower-triangular: tokens 16np.. need j = 16ks.. for ks <= np
          std::uint32_t b0[kPF][2], b1[kPF][2];
          load_b_planes_x2<kPF>(planes, 16 * np, 16 * ks, lane, b0, b1);
          mma_split<Pol::kOrder>(vn[2 * np], a, b0);
          mma_split<Pol::kOrder>(vn[2 * np + 1], a, b1);
        }
      }
      if constexpr (kKSplit == 2) tiles_to_exchange(vn, exchange + 2 * Sm::kTileFloats, lane);
      if (kKSplit == 2 && p.save) {  // (kKSplit = 1: among the o products below)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) store_tile_pairs(vn[nt], lane, vn_out, std::int64_t(Hv) * V, 8 * nt, L);
      }
    }
    __syncthreads();  // every warp is done with Ainv and with its v columns; v_new is in the exchange

    build_p_planes<T, kK, kWarps>(q_tile, k_tile, Sm::kLdK, rec_tile, planes, L, warp, lane);  // over the Ainv planes
    __syncthreads();  // P complete
    if (p.save && vtile == 0) save_p_planes<T, kThreads>(planes, p.P, std::int64_t(chunk0 + it) * Hv + hv, tid);
    if constexpr (kKSplit == 2) {
      if (!does_v_new) tiles_add_from_exchange(vn, exchange + 2 * Sm::kTileFloats, lane);  // vn was zero
    }

    // o = scale rstd_q e^{G} (q h) + P v_new, staged in the slab's own v columns.
    if (does_o) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) z[nt][e] *= rec_tile[(8 * nt + 2 * t + (e & 1)) * kRecord + kRecC];
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        if (kKSplit == 1 && p.save) {  // v_new out, two tiles per k-step
          store_tile_pairs(vn[2 * ks], lane, vn_out, std::int64_t(Hv) * V, 16 * ks, L);
          store_tile_pairs(vn[2 * ks + 1], lane, vn_out, std::int64_t(Hv) * V, 16 * ks + 8, L);
        }
        std::uint32_t a[kPF][4];
        a_from_acc<kPF>(vn[2 * ks], vn[2 * ks + 1], a);
#pragma unroll
        for (int np = ks; np < 4; ++np) {  // P is lower-triangular
          std::uint32_t b0[kPF][2], b1[kPF][2];
          load_b_planes_x2<kPF>(planes, 16 * np, 16 * ks, lane, b0, b1);
          mma_split<Pol::kOrder>(z[2 * np], a, b0);
          mma_split<Pol::kOrder>(z[2 * np + 1], a, b1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int const i = 8 * nt + 2 * t + (e & 1), col = wc + g + 8 * (e >> 1);
          v_tile[i * Sm::kLdV + col] = from_float<T>(z[nt][e]);
        }
      }
    }

    // hᵀ ← e^{G_last} hᵀ + (rstd_k e^{G_last − G} ⊙ v_new)ᵀ k, each warp over its state columns.
    update_state(h, vn, k_tile, Sm::kLdK, rec_tile, d0, L, lane);
    __syncthreads();  // the o tile is complete

    constexpr int kVVecs = kBV / kVecN;
    for (int idx = tid; idx < kChunk * kVVecs; idx += kThreads) {
      int const r = idx / kVVecs, cv = idx % kVVecs;
      if (r < L) {
        store16(o + ((t0 + r) * Hv + hv) * V + v0 + cv * kVecN,
                *reinterpret_cast<Vec16<T> const*>(v_tile + r * Sm::kLdV + cv * kVecN));
      }
    }
  }

  if (p.final_state != nullptr) store_state_slab(h, p.final_state, state_off, d0, V, t);
}

}  // namespace fusepack::gated_delta_fwd_detail
