// Backward stage 2 of the chunked gated delta rule: gated_delta_bwd_state, per (example, value head, 16·kSlabs
// value columns), the reverse chunk-to-chunk recurrence of the state gradient dh, carried in fp32 registers by one
// warp per 16 value columns (the full chain) or two, each over half of K (the lean chain, gated_delta_schedule.h).
// Reads k, q, do, P and the records (saved by the forward of 16-bit runs, written by stage 1 for fp32 runs), the saved
// Ainv planes and dfinal_state; writes dv, dinitial_state, and for stage 3 the gradient of the state leaving every
// chunk (dh_nextᵀ [NC, Hv, V, K] in state_tile order) and y [T, Hv, V] (Handover<T>).
#pragma once

#include "kernels/gated_delta/gated_delta_bwd_common.cuh"

#include <cstddef>
#include <cstdint>

namespace fusepack::gated_delta_bwd_detail {

using namespace gated_delta_mma;

// The recurrence's shared memory, per stage (one chunk's inputs): the raw k, q rows and the block's do columns, P and
// Ainv as bf16 planes, the records. Two stages (the next chunk streams in while this one computes) where they fit,
// one for fp32 inputs.
template <typename T, int K, int kSlabs>
struct StateSmem {
  static constexpr int kParts = SplitPolicy<T>::kOrder + 1;
  static constexpr int kStages = sizeof(T) == 4 ? 1 : 2;
  static constexpr int kBV = 16 * kSlabs;  // value columns of a block
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

// The stages as StateSmem (k, q rows, the block's do columns, P and Ainv planes, records), then, with two warps per
// slab, their exchange: fp32 [slabs][partial dv_new of warp 0, of warp 1, y of warp 0, of warp 1][16 × 64], and the
// chunk's y and dv by token rows ([64][block's columns + 16 bytes], tile_to_rows), which the block stores whole,
// wherever they fit a block (every block but the full chain's 8-slab block of fp16 runs, whose y is fp32: that one
// stores each tile from its registers, store_tile_pairs).
template <typename T, int K, int kSlabs, int kKSplit>
struct StateBlockSmem {
  using Stage = StateSmem<T, K, kSlabs>;  // the stages of kSlabs·16 value columns
  static constexpr int kTileFloats = 16 * kChunk;
  static constexpr int kLdY = Stage::kBV + 16 / int(sizeof(Handover<T>)), kLdDv = Stage::kBV + 16 / int(sizeof(T));
  static constexpr std::size_t kExchange = Stage::kBytes;
  static_assert(kExchange % 16 == 0, "the exchange is read and written in 16-byte words");
  static constexpr std::size_t kYRows = kExchange + (kKSplit == 2 ? sizeof(float) * kSlabs * 4 * kTileFloats : 0);
  static constexpr std::size_t kRowBytes = sizeof(Handover<T>) * kChunk * kLdY + sizeof(T) * kChunk * kLdDv;
  static constexpr bool kRowStores = kYRows + kRowBytes <= kMaxBlockSmem;
  static constexpr std::size_t kDvRows = kYRows + (kRowStores ? sizeof(Handover<T>) * kChunk * kLdY : 0);
  static constexpr std::size_t kBytes = kDvRows + (kRowStores ? sizeof(T) * kChunk * kLdDv : 0);
  static_assert(kRowStores || kKSplit == 1, "the lean chain's blocks stage their rows");
};

// The reverse chunk recurrence for example n, value head j and the block's 16·kSlabs value columns; dh starts at
// dfinal_state (or 0). A slab of kKSplit warps owns 16 value columns and carries dhᵀ [16, K] of them in fp32
// registers as accumulator tiles, warp kh the state columns K/kKSplit·kh..; the block shares only the chunk's inputs.
// Per chunk, last first, in the transposed frame (rows: the slab's value columns; columns: the chunk's tokens i):
//   dh_next out;  dv_newᵀ = kBrSrk ⊙ (dhᵀ kᵀ) + doᵀ P;  yᵀ = dv_newᵀ Ainv;  y out, dv = β ⊙ y;
//   dhᵀ ← e^{G_last} dhᵀ + (kBrCq ⊙ do)ᵀ q + (kBrCy ⊙ y)ᵀ k,
// with the raw q, k, do as operands (exact as bf16 parts) and the row scales on the other side. With two warps per
// slab (kKSplit = 2): each forms kBrSrk ⊙ (dhᵀ kᵀ) over its half of K plus doᵀ P on its token row blocks
// (lean_owns_token_block), the two parts summed through shared memory (the same sum in both warps); y on its row
// blocks, (kBrCy ⊙ y) exchanged; the update over its half. The warps of a block meet at block barriers.
template <typename T, int K, int kSlabs, int kKSplit>
__global__ void __launch_bounds__(kSlabs * kKSplit * 32, 1)
    gated_delta_bwd_state(GatedDeltaBwdParams p, __nv_bfloat16 const* P_planes, float const* rec, float* dh_out,
                          Handover<T>* y_out) {
  static_assert(kKSplit == 1 || kKSplit == 2, "a slab is one or two warps");
  using Sm = StateBlockSmem<T, K, kSlabs, kKSplit>;
  using St = typename Sm::Stage;
  using Pol = SplitPolicy<T>;
  constexpr int kBThreads = kSlabs * kKSplit * 32, kBV = St::kBV, kKW = K / kKSplit, kStateTiles = kKW / 8;
  constexpr int kPF = Pol::kOrder + 1, kPR = Pol::kRawParts, kOrder = Pol::kOrder;
  // The lean chain's half-K slabs leave registers to spare: its products run over every token tile of the last chunk
  // too (rows_all), where the full chain skips those past L, and in 16-bit runs its copies are unrolled
  // (copy_rows_async; fp32 runs' single stage has no registers left for that). The stage holds zeros past L (rows of
  // k, q, do, the planes and the records), so those products add zeros; a guard makes the compiler recompute the
  // operands' shared-memory addresses behind it, which saves the full chain registers at the cost of instructions.
  constexpr bool rows_all = kKSplit == 2, kUnrolledCopies = rows_all && sizeof(T) == 2;
  extern __shared__ __align__(16) unsigned char gd_state_smem[];

  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  int const slab = warp / kKSplit, kh = warp % kKSplit;
  // Whether this warp computes dv_new's doᵀP term and y on the 16-token row block np: all of them when alone.
  auto const owns = [&](int np) { return kKSplit == 1 || lean_owns_token_block(kh, np); };
  int const Hk = p.Hk, Hv = p.Hv, V = p.V, tiles = V / kBV;
  GatedDeltaChunks::ChainBlock const block = gated_delta_chunks(p).chain_block(blockIdx.x, Hv, tiles);
  int const vtile = block.tile, j = block.head, n = block.example;  // longest example first
  int const khead = j / (Hv / Hk);
  int const v0 = vtile * kBV, wc = 16 * slab;  // the block's and the slab's first value column
  int const d0 = kh * kKW;                     // the warp's first state column
  GatedDeltaChunks const table = gated_delta_chunks(p);
  int const c_first = table.first_chunk(n), c_end = table.first_chunk(n + 1);
  std::int64_t const bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];  // chunk c starts at bos + 64·(c − c_first)
  auto const* k = static_cast<T const*>(p.k);
  auto const* q = static_cast<T const*>(p.q);
  auto const* dout = static_cast<T const*>(p.dout);
  auto* dv = static_cast<T*>(p.dv);
  auto const* A_planes = reinterpret_cast<__nv_bfloat16 const*>(p.Ainv);
  float* const exchange = reinterpret_cast<float*>(gd_state_smem + Sm::kExchange) + slab * 4 * Sm::kTileFloats;
  // (kKSplit = 1: the exchange is not allocated; these are never dereferenced)
  float* const x_mine = exchange + kh * Sm::kTileFloats;
  float const* const x_other = exchange + (kh ^ 1) * Sm::kTileFloats;
  float* const y_mine = exchange + (2 + kh) * Sm::kTileFloats;
  float const* const y_other = exchange + (2 + (kh ^ 1)) * Sm::kTileFloats;
  // (kRowStores: the chunk's y and dv by token rows; otherwise not allocated and never dereferenced)
  auto* const y_rows = reinterpret_cast<Handover<T>*>(gd_state_smem + Sm::kYRows);
  auto* const dv_rows = reinterpret_cast<T*>(gd_state_smem + Sm::kDvRows);

  // dhᵀ[v0 + wc + g + 8·(e>>1)][d0 + 8·nt + 2t + (e&1)] in dh[nt][e]; state tensors are [.., K, V].
  float dh[kStateTiles][4];
  std::int64_t const state_off = (std::int64_t(n) * Hv + j) * K * V + v0 + wc + g;
  load_state_slab(dh, p.dfinal_state, state_off, d0, V, t);

  // Chunk c into stage s: k, q rows, the block's do columns, the P and Ainv planes, the records (zeros past L).
  auto issue = [&](int c, int s) {
    unsigned char* base = gd_state_smem + s * St::kStage;
    std::int64_t const t0 = bos + std::int64_t(c - c_first) * kChunk;
    int const L = static_cast<int>(eos - t0 < kChunk ? eos - t0 : kChunk);
    constexpr int kRowT = int(sizeof(T)) * K, kLdT = int(sizeof(T)) * St::kLdK;
    auto const copy = [&](int valid) {
      copy_rows_async<kChunk, kRowT, kBThreads, kUnrolledCopies>(base + St::kKTile, kLdT, k + (t0 * Hk + khead) * K,
                                                                 sizeof(T) * Hk * K, valid);
      copy_rows_async<kChunk, kRowT, kBThreads, kUnrolledCopies>(base + St::kQTile, kLdT, q + (t0 * Hk + khead) * K,
                                                                 sizeof(T) * Hk * K, valid);
      copy_rows_async<kChunk, int(sizeof(T)) * kBV, kBThreads, kUnrolledCopies>(
          base + St::kDoTile, int(sizeof(T)) * St::kLdV, dout + (t0 * Hv + j) * V + v0, sizeof(T) * Hv * V, valid);
#pragma unroll
      for (int part = 0; part < kPF; ++part) {
        constexpr int kRowP = 2 * kChunk, kLdP = 2 * kLdSq;
        copy_rows_async<kChunk, kRowP, kBThreads, kUnrolledCopies>(
            base + St::kPPlanes + 2 * part * kPlane, kLdP,
            P_planes + ((std::int64_t(c) * Hv + j) * kPF + part) * kChunk * kChunk, kRowP, kChunk);
        copy_rows_async<kChunk, kRowP, kBThreads, kUnrolledCopies>(base + St::kAPlanes + 2 * part * kPlane, kLdP,
                                                                   A_planes + ((t0 * Hv + j) * kPF + part) * kChunk,
                                                                   2 * std::int64_t(Hv) * kPF * kChunk, valid);
      }
      copy_rows_async<kChunk, 4 * kBwdRecord, kBThreads, kUnrolledCopies>(base + St::kRec, 4 * kBwdRecord,
                                                                          rec + (t0 * Hv + j) * kBwdRecord,
                                                                          4 * std::int64_t(Hv) * kBwdRecord, valid);
    };
    copy_whole_or_guarded<kChunk, kUnrolledCopies>(copy, L);
  };

  if (c_end > c_first) issue(c_end - 1, 0);
  cp_async_commit();
  for (int c = c_end - 1, it = 0; c >= c_first; --c, ++it) {
    int const s = St::kStages == 2 ? (it & 1) : 0;
    cp_async_wait_all();
    __syncthreads();  // stage s has landed for every thread; every read of the other stage (the chunk after) is done
    if constexpr (St::kStages == 2) {
      if (c > c_first) issue(c - 1, s ^ 1);
      cp_async_commit();
    }
    unsigned char const* base = gd_state_smem + s * St::kStage;
    T const* k_tile = reinterpret_cast<T const*>(base + St::kKTile);
    T const* q_tile = reinterpret_cast<T const*>(base + St::kQTile);
    T const* do_tile = reinterpret_cast<T const*>(base + St::kDoTile);
    auto const* P_s = reinterpret_cast<__nv_bfloat16 const*>(base + St::kPPlanes);
    auto const* A_s = reinterpret_cast<__nv_bfloat16 const*>(base + St::kAPlanes);
    float const* rec_s = reinterpret_cast<float const*>(base + St::kRec);
    std::int64_t const t0 = bos + std::int64_t(c - c_first) * kChunk;
    int const L = static_cast<int>(eos - t0 < kChunk ? eos - t0 : kChunk);
    auto const rec_at = [&](int i, int field) { return rec_s[i * kBwdRecord + field]; };

    // This warp's part of dv_newᵀ: kBrSrk ⊙ (dhᵀ kᵀ) over its state columns (dh_next out on the way, two 16-byte
    // stores per k-step), plus doᵀ P on its token blocks.
    float* const dh_next =
        dh_out + (std::int64_t(c) * Hv + j) * V * K + state_tile(K, (v0 + wc) / 16, d0 / 8) + 4 * lane;
    float x[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKW / 16; ++ks) {
#pragma unroll
      for (int nt = 2 * ks; nt < 2 * ks + 2; ++nt) {
        *reinterpret_cast<float4*>(dh_next + state_tile(K, 0, nt)) =
            make_float4(dh[nt][0], dh[nt][1], dh[nt][2], dh[nt][3]);
      }
      std::uint32_t a[kPF][4];
      a_from_acc<kPF>(dh[2 * ks], dh[2 * ks + 1], a);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (rows_all || 16 * np < L) {
          std::uint32_t b0[kPR][2], b1[kPR][2];
          load_b_cols_x2<T, kPR>(k_tile, St::kLdK, 16 * np, d0 + 16 * ks, lane, b0, b1);
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
      if ((rows_all || 16 * ks < L) && (kKSplit == 1 || kh == 0 || ks > 0)) {  // the second warp's blocks {1, 2}
        float f[8];                                                               // need r >= 1
        load_a_trans_floats<T>(do_tile, St::kLdV, wc, 16 * ks, lane, f);
        std::uint32_t a[kPR][4];
        a_from_floats<kPR>(f, a);
#pragma unroll
        for (int np = 0; np <= ks; ++np) {
          if (owns(np)) {
            std::uint32_t b0[kPF][2], b1[kPF][2];
            load_b_planes_rows_x2<kPF>(P_s, kPlane, kLdSq, 16 * ks, 16 * np, lane, b0, b1);
            mma_split<kOrder>(x[2 * np], a, b0);
            mma_split<kOrder>(x[2 * np + 1], a, b1);
          }
        }
      }
    }
    if constexpr (kKSplit == 2) {
      tiles_to_exchange(x, x_mine, lane);
      __syncthreads();
      tiles_add_from_exchange(x, x_other, lane);
    }

    // yᵀ = dv_newᵀ Ainv on the warp's token blocks (Ainv[r][i] = 0 for i > r); y and dv out (staged by token rows
    // and stored whole by the block after a barrier, where they fit; StateBlockSmem).
    float y[8][4] = {};
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if ((rows_all || 16 * ks < L) && (kKSplit == 1 || kh == 0 || ks > 0)) {
        std::uint32_t a[kPF][4];
        a_from_acc<kPF>(x[2 * ks], x[2 * ks + 1], a);
#pragma unroll
        for (int np = 0; np <= ks; ++np) {
          if (owns(np)) {
            std::uint32_t b0[kPF][2], b1[kPF][2];
            load_b_planes_rows_x2<kPF>(A_s, kPlane, kLdSq, 16 * ks, 16 * np, lane, b0, b1);
            mma_split<kOrder>(y[2 * np], a, b0);
            mma_split<kOrder>(y[2 * np + 1], a, b1);
          }
        }
      }
    }
    {
      std::int64_t const o = (t0 * Hv + j) * V + v0 + wc, stride = std::int64_t(Hv) * V;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if (owns(nt / 2)) {
          float dv_t[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) dv_t[e] = rec_at(8 * nt + 2 * t + (e & 1), kBrBeta) * y[nt][e];
          if constexpr (Sm::kRowStores) {
            tile_to_rows(y[nt], y_rows + wc, Sm::kLdY, 8 * nt, lane);
            tile_to_rows(dv_t, dv_rows + wc, Sm::kLdDv, 8 * nt, lane);
          } else {
            store_tile_pairs(y[nt], lane, y_out + o, stride, 8 * nt, L);
            store_tile_pairs(dv_t, lane, dv + o, stride, 8 * nt, L);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) y[nt][e] *= rec_at(8 * nt + 2 * t + (e & 1), kBrCy);
          if constexpr (kKSplit == 2) tile_to_exchange(y[nt], y_mine, nt, lane);
        }
      }
    }
    if constexpr (Sm::kRowStores) {
      __syncthreads();  // every warp's y, dv rows are staged, and its y exchanged (the next writes of either follow
                        // the next chunk's first barrier)
      std::int64_t const o = (t0 * Hv + j) * V + v0, stride = std::int64_t(Hv) * V;
      store_stage_rows<kChunk, int(sizeof(Handover<T>)) * kBV, kBThreads>(
          y_out + o, sizeof(Handover<T>) * stride, y_rows, int(sizeof(Handover<T>)) * Sm::kLdY, L);
      store_stage_rows<kChunk, int(sizeof(T)) * kBV, kBThreads>(dv + o, sizeof(T) * stride, dv_rows,
                                                                 int(sizeof(T)) * Sm::kLdDv, L);
    }
    if constexpr (kKSplit == 2) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if (!owns(nt / 2)) tile_from_exchange(y[nt], y_other, nt, lane);
      }
    }

    // dhᵀ ← e^{G_last} dhᵀ + (kBrCq ⊙ do)ᵀ q + (kBrCy ⊙ y)ᵀ k over the warp's state columns.
    float const gamma = rec_at(0, kBrGamma);
#pragma unroll
    for (int nt = 0; nt < kStateTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dh[nt][e] *= gamma;
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (rows_all || 16 * ks < L) {
        float f[8];
        load_a_trans_floats<T>(do_tile, St::kLdV, wc, 16 * ks, lane, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] *= rec_at(16 * ks + 8 * (e >> 2) + 2 * t + (e & 1), kBrCq);
        std::uint32_t aq[kPF][4], ay[kPF][4];
        a_from_floats<kPF>(f, aq);
        a_from_acc<kPF>(y[2 * ks], y[2 * ks + 1], ay);
#pragma unroll
        for (int np = 0; np < kKW / 16; ++np) {
          std::uint32_t b0[kPR][2], b1[kPR][2];
          load_b_rows_x2<T, kPR>(q_tile, St::kLdK, 16 * ks, d0 + 16 * np, lane, b0, b1);
          mma_split<kOrder>(dh[2 * np], aq, b0);
          mma_split<kOrder>(dh[2 * np + 1], aq, b1);
          load_b_rows_x2<T, kPR>(k_tile, St::kLdK, 16 * ks, d0 + 16 * np, lane, b0, b1);
          mma_split<kOrder>(dh[2 * np], ay, b0);
          mma_split<kOrder>(dh[2 * np + 1], ay, b1);
        }
      }
    }
    if constexpr (St::kStages == 1) {
      __syncthreads();  // every warp is done with the stage
      if (c > c_first) issue(c - 1, 0);
      cp_async_commit();
    }
  }

  if (p.dinitial_state != nullptr) store_state_slab(dh, p.dinitial_state, state_off, d0, V, t);
}

}  // namespace fusepack::gated_delta_bwd_detail
