// The lean backward's state recurrence in warpgroup products (wgmma, kernels/common/wgmma.cuh): bf16 runs at K = V =
// 128. The same chunk step as gated_delta_bwd_state (gated_delta_bwd_state.cuh), one warpgroup per 64 value columns
// instead of two warps per 16: warp w carries dhᵀ of the block's value columns 16w .. 16w + 15 over all 128 state
// columns (64 fp32 registers a thread, the accumulators of the update's products), so nothing is exchanged between
// warps. Per chunk, last first, with dh the gradient of the state leaving it:
//   dh_next out;
//   dv_newᵀ [64 columns × 64 tokens] = kBrSrk ⊙ (dhᵀ kᵀ) + doᵀ P: A = dhᵀ's two bf16 parts, then the raw doᵀ (exact
//   in bf16), from registers; B = the k tile (K-major), then P's two planes read transposed (MN-major: P[r][i]);
//   yᵀ = dv_newᵀ Ainv: A = dv_newᵀ's two parts from registers, B = Ainv's two planes read transposed, three products
//   per K step (hi·lo, lo·hi, hi·hi);
//   y and dv = β ⊙ y out (staged by token rows, stored whole by the block);
//   dhᵀ ← e^{G_last} dhᵀ + (kBrCq ⊙ do)ᵀ q + (kBrCy ⊙ y)ᵀ k: A = the scaled doᵀ's and yᵀ's parts from registers, B =
//   the q and k tiles read transposed, N = 128.
// Out: dh_next [NC, Hv, V, K] in state_tile order, y and dv, dinitial_state: what gated_delta_bwd_state writes, for
// the same per-chunk kernel, which runs beside it (its kBeside form): each block publishes in `done` [N, Hv, V / 64]
// how many chunks, from the example's last, it has written, every kWgStatePublishEvery chunks and after the last.
// Its sums run in another order than mma.sync's (dhᵀ kᵀ over all of K at once rather than two halves added), so its
// results are not those of gated_delta_bwd_state bit for bit.
#pragma once

#include "kernels/common/wgmma.cuh"
#include "kernels/gated_delta/gated_delta_bwd_common.cuh"
#include "kernels/gated_delta/gated_delta_wg.cuh"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace fusepack::gated_delta_bwd_detail {

constexpr int kWgStateColumns = 64;  // value columns of a block: one warpgroup, 16 per warp

// One stage (a chunk's inputs), every operand tile 1024-byte aligned for its 128-byte swizzle:
//   k and q [64 tokens][128] bf16, each as two K-major tiles of 64 state columns (8 KB each);
//   P's and Ainv's two planes [64][64] bf16 (8 KB each; read MN-major);
//   do's 64 value columns [64 tokens][64 + pad] bf16, plain rows (read by ldmatrix.trans);
//   the records [64][kBwdRecord] fp32.
// Then, once: y and dv of the chunk by token rows ([64][64 + 16 bytes] each, tile_to_rows).
struct WgStateSmem {
  static constexpr int kLdDo = kWgStateColumns + kLdPad, kLdRows = kWgStateColumns + kLdPad;
  static constexpr std::size_t kK = 0;
  static constexpr std::size_t kQ = kK + 2 * 8192;
  static constexpr std::size_t kPPlanes = kQ + 2 * 8192;
  static constexpr std::size_t kAPlanes = kPPlanes + 2 * 8192;
  static constexpr std::size_t kDo = kAPlanes + 2 * 8192;
  static constexpr std::size_t kRec = kDo + 2 * kChunk * kLdDo;
  static constexpr std::size_t kStage = (kRec + 4 * kChunk * kBwdRecord + 1023) / 1024 * 1024;
  static constexpr std::size_t kYRows = 2 * kStage;
  static constexpr std::size_t kDvRows = kYRows + 2 * kChunk * kLdRows;
  static constexpr std::size_t kBytes = kDvRows + 2 * kChunk * kLdRows + 1024;  // + 1024: aligned up by the kernel
};

// How often a block publishes its count of chunks written (and after its last): the per-chunk kernel beside it takes
// tens of microseconds a chunk, the recurrence a few.
constexpr int kWgStatePublishEvery = 4;

__global__ void __launch_bounds__(128, 1)
    gated_delta_bwd_state_wg(GatedDeltaBwdParams p, __nv_bfloat16 const* P_planes, float const* rec, float* dh_out,
                             __nv_bfloat16* y_out, int* done) {
  using Sm = WgStateSmem;
  using T = __nv_bfloat16;
  static_assert(std::is_same_v<Handover<T>, T>, "bf16 runs hand y over in bf16");
  constexpr int kK = 128, kThreads = 128, kPF = 2, kBV = kWgStateColumns;
  extern __shared__ unsigned char gd_state_smem_raw[];
  // The swizzled tiles need 1024-byte alignment in the shared window (the dynamic buffer guarantees 16).
  auto const raw_address = static_cast<std::uint32_t>(__cvta_generic_to_shared(gd_state_smem_raw));
  unsigned char* const smem = gd_state_smem_raw + ((1024 - (raw_address & 1023)) & 1023);

  int const tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  int const Hk = p.Hk, Hv = p.Hv, V = p.V, tiles = V / kBV;
  GatedDeltaChunks const table = gated_delta_chunks(p);
  GatedDeltaChunks::ChainBlock const block = table.chain_block(blockIdx.x, Hv, tiles);
  int const j = block.head, n = block.example;  // longest example first
  int const khead = j / (Hv / Hk);
  int const v0 = block.tile * kBV, wc = 16 * warp;  // the block's and the warp's first value column
  int const vb = (v0 + wc) / 16;                    // the warp's 16-column block of V
  int const c_first = table.first_chunk(n), c_end = table.first_chunk(n + 1);
  std::int64_t const bos = p.cu_seqlens[n], eos = p.cu_seqlens[n + 1];  // chunk c starts at bos + 64·(c − c_first)
  auto* const dv = static_cast<T*>(p.dv);
  auto const* const A_planes = reinterpret_cast<T const*>(p.Ainv);
  T* const y_rows = reinterpret_cast<T*>(smem + Sm::kYRows);
  T* const dv_rows = reinterpret_cast<T*>(smem + Sm::kDvRows);
  int* const my_done = done + (std::int64_t(n) * Hv + j) * tiles + block.tile;
  grid_launch_dependents();  // every block has started once the per-chunk kernel's blocks may start

  // dhᵀ[v0 + wc + g + 8·(e>>1)][8·nt + 2t + (e&1)] in dh[4·nt + e]: the update's accumulators (m64n128).
  float dh[64];
  std::int64_t const state_off = (std::int64_t(n) * Hv + j) * kK * V + v0 + wc + g;
  load_state_slab(reinterpret_cast<float(&)[16][4]>(dh), p.dfinal_state, state_off, 0, V, t);

  // Chunk c into stage s (zeros past L in k, q, do, Ainv and the records; P's planes are whole). Each thread copies one
  // 16-byte column of the k and q tiles (rows tid / 16 + 8u) and of the planes (rows tid / 8 + 16u): rows 8 apart share
  // a swizzle, so each copy is the last one's addresses plus constants.
  int const kc = tid % 16, kr = tid / 16, pc = tid % 8, pr = tid / 8;
  int const k_dst = (kc >> 3) * 8192 + wgmma::sw128_offset(kr, kc & 7);
  int const p_dst = wgmma::sw128_offset(pr, pc);
  auto issue = [&](int c, int s) {
    unsigned char* const base = smem + s * Sm::kStage;
    std::int64_t const t0 = bos + std::int64_t(c - c_first) * kChunk;
    int const L = static_cast<int>(eos - t0 < kChunk ? eos - t0 : kChunk);
    std::int64_t const kq_off = (t0 * Hk + khead) * kK + std::int64_t(kr) * Hk * kK + 8 * kc;
    T const* const k0 = static_cast<T const*>(p.k) + (t0 * Hk + khead) * kK;
    T const* const k_src = static_cast<T const*>(p.k) + kq_off;
    T const* const q_src = static_cast<T const*>(p.q) + kq_off;
    T const* const a0 = A_planes + (t0 * Hv + j) * kPF * kChunk;
    T const* const a_src = a0 + std::int64_t(pr) * Hv * kPF * kChunk + 8 * pc;
    T const* const p_src = P_planes + (std::int64_t(c) * Hv + j) * kPF * kChunk * kChunk + pr * kChunk + 8 * pc;
    std::int64_t const k_step8 = std::int64_t(8) * Hk * kK, a_step16 = std::int64_t(16) * Hv * kPF * kChunk;
    auto const copy = [&](auto guarded) {  // a whole chunk without the guards (every chunk but an example's last)
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        bool const in = !decltype(guarded)::value || kr + 8 * u < L;
        cp_async16(base + Sm::kK + k_dst + u * 1024, in ? k_src + u * k_step8 : k0, in ? 16 : 0);
        cp_async16(base + Sm::kQ + k_dst + u * 1024, in ? q_src + u * k_step8 : k0, in ? 16 : 0);
      }
#pragma unroll
      for (int part = 0; part < kPF; ++part) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          bool const in = !decltype(guarded)::value || pr + 16 * u < L;
          cp_async16(base + Sm::kAPlanes + p_dst + part * 8192 + u * 2048,
                     in ? a_src + u * a_step16 + part * kChunk : a0, in ? 16 : 0);
          cp_async16(base + Sm::kPPlanes + p_dst + part * 8192 + u * 2048,
                     p_src + part * kChunk * kChunk + u * 16 * kChunk, 16);
        }
      }
    };
    if (L == kChunk) {
      copy(std::false_type{});
    } else {
      copy(std::true_type{});
    }
    copy_rows_async<kChunk, int(sizeof(T)) * kBV, kThreads, true>(
        base + Sm::kDo, int(sizeof(T)) * Sm::kLdDo, static_cast<T const*>(p.dout) + (t0 * Hv + j) * V + v0,
        sizeof(T) * std::int64_t(Hv) * V, L);
    copy_rows_async<kChunk, 4 * kBwdRecord, kThreads, true>(base + Sm::kRec, 4 * kBwdRecord,
                                                            rec + (t0 * Hv + j) * kBwdRecord,
                                                            4 * std::int64_t(Hv) * kBwdRecord, L);
  };

  if (c_end > c_first) issue(c_end - 1, 0);
  cp_async_commit();
  float x[32] = {}, y[32] = {};  // dv_newᵀ and yᵀ: each chunk's first product overwrites them
  for (int c = c_end - 1, it = 0; c >= c_first; --c, ++it) {
    int const s = it & 1;
    cp_async_wait_all();
    wgmma::fence_shared_to_async();  // this thread's cp.async writes, for the products' reads
    __syncthreads();  // stage s has landed for every thread; every read of stage s^1 (the chunk after) is done

    unsigned char* const base = smem + s * Sm::kStage;
    T const* const do_tile = reinterpret_cast<T const*>(base + Sm::kDo);
    float const* const rec_s = reinterpret_cast<float const*>(base + Sm::kRec);
    auto const rec_at = [&](int i, int field) { return rec_s[i * kBwdRecord + field]; };
    std::uint64_t const desc_k = wgmma::sw128_desc(base + Sm::kK);
    std::uint64_t const desc_k_mn = wgmma::sw128_mn_desc(base + Sm::kK, 8192);
    std::uint64_t const desc_q_mn = wgmma::sw128_mn_desc(base + Sm::kQ, 8192);
    std::uint64_t const desc_p[2] = {wgmma::sw128_mn_desc(base + Sm::kPPlanes, 8192),
                                     wgmma::sw128_mn_desc(base + Sm::kPPlanes + 8192, 8192)};
    std::uint64_t const desc_a[2] = {wgmma::sw128_mn_desc(base + Sm::kAPlanes, 8192),
                                     wgmma::sw128_mn_desc(base + Sm::kAPlanes + 8192, 8192)};
    std::int64_t const t0 = bos + std::int64_t(c - c_first) * kChunk;
    int const L = static_cast<int>(eos - t0 < kChunk ? eos - t0 : kChunk);

    // dhᵀ kᵀ over all 128 state columns from dhᵀ's parts; while it runs, the count published (the chunks after c),
    // the next chunk's copies issued, dh_next stored and doᵀ's fragments loaded. Then scaled by kBrSrk.
    std::uint32_t adh[kK / 16][kPF][4];
    a_from_acc_steps<kPF>(dh, adh);
    issue_state_times_kt(x, adh, desc_k);
    if (tid == 0 && it > 0 && it % kWgStatePublishEvery == 0) publish_count(my_done, it);
    if (c > c_first) issue(c - 1, s ^ 1);
    cp_async_commit();
    store_state(dh, dh_out + (std::int64_t(c) * Hv + j) * V * kK + state_tile(kK, vb, 0) + 4 * lane);
    std::uint32_t ado[4][1][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      float f[8];
      load_a_trans_floats<T>(do_tile, Sm::kLdDo, wc, 16 * ks, lane, f);
      a_from_floats<1>(f, ado[ks]);
    }
    wgmma::wait<0>();
    hold_registers(adh);
    hold_registers(x);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[4 * nt + e] *= rec_at(8 * nt + 2 * t + (e & 1), kBrSrk);
    }

    // + doᵀ P (P's planes [r][i], read transposed: K = the token r).
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma::mma_m64n64k16_bf16_rs<true>(x, ado[ks][0], wgmma::k_step_mn(desc_p[1], ks), true);
      wgmma::mma_m64n64k16_bf16_rs<true>(x, ado[ks][0], wgmma::k_step_mn(desc_p[0], ks), true);
    }
    wgmma::commit();
    wgmma::wait<0>();
    hold_registers(ado);
    hold_registers(x);

    // yᵀ = dv_newᵀ Ainv (Ainv's planes [r][i], read transposed).
    std::uint32_t adv[4][kPF][4];
    a_from_acc_steps<kPF>(x, adv);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma::mma_m64n64k16_bf16_rs<true>(y, adv[ks][0], wgmma::k_step_mn(desc_a[1], ks), ks > 0);
      wgmma::mma_m64n64k16_bf16_rs<true>(y, adv[ks][1], wgmma::k_step_mn(desc_a[0], ks), true);
      wgmma::mma_m64n64k16_bf16_rs<true>(y, adv[ks][0], wgmma::k_step_mn(desc_a[0], ks), true);
    }
    wgmma::commit();
    wgmma::wait<0>();
    hold_registers(adv);
    hold_registers(y);

    // y and dv = β ⊙ y by token rows (the block stores them whole after a barrier, while the update runs); then y
    // scaled by kBrCy.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      float* const yt = y + 4 * nt;
      float dv_t[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) dv_t[e] = rec_at(8 * nt + 2 * t + (e & 1), kBrBeta) * yt[e];
      tile_to_rows(reinterpret_cast<float const(&)[4]>(*yt), y_rows + wc, Sm::kLdRows, 8 * nt, lane);
      tile_to_rows(dv_t, dv_rows + wc, Sm::kLdRows, 8 * nt, lane);
#pragma unroll
      for (int e = 0; e < 4; ++e) yt[e] *= rec_at(8 * nt + 2 * t + (e & 1), kBrCy);
    }

    // dhᵀ ← e^{G_last} dhᵀ + (kBrCq ⊙ do)ᵀ q + (kBrCy ⊙ y)ᵀ k (q and k read transposed: N = the 128 state columns).
    float const gamma = rec_at(0, kBrGamma);
#pragma unroll
    for (int e = 0; e < 64; ++e) dh[e] *= gamma;
    std::uint32_t aq[4][kPF][4], ay[4][kPF][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      float f[8];
      load_a_trans_floats<T>(do_tile, Sm::kLdDo, wc, 16 * ks, lane, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] *= rec_at(16 * ks + 8 * (e >> 2) + 2 * t + (e & 1), kBrCq);
      a_from_floats<kPF>(f, aq[ks]);
    }
    a_from_acc_steps<kPF>(y, ay);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      wgmma::mma_m64n128k16_bf16_rs<true>(dh, aq[ks][1], wgmma::k_step_mn(desc_q_mn, ks), true);
      wgmma::mma_m64n128k16_bf16_rs<true>(dh, aq[ks][0], wgmma::k_step_mn(desc_q_mn, ks), true);
      wgmma::mma_m64n128k16_bf16_rs<true>(dh, ay[ks][1], wgmma::k_step_mn(desc_k_mn, ks), true);
      wgmma::mma_m64n128k16_bf16_rs<true>(dh, ay[ks][0], wgmma::k_step_mn(desc_k_mn, ks), true);
    }
    wgmma::commit();
    __syncthreads();  // every warp's y, dv rows are staged (the next writes of either follow the next chunk's barrier)
    {
      std::int64_t const o = (t0 * Hv + j) * V + v0, stride = std::int64_t(Hv) * V;
      store_stage_rows<kChunk, int(sizeof(T)) * kBV, kThreads>(y_out + o, sizeof(T) * stride, y_rows,
                                                              int(sizeof(T)) * Sm::kLdRows, L);
      store_stage_rows<kChunk, int(sizeof(T)) * kBV, kThreads>(dv + o, sizeof(T) * stride, dv_rows,
                                                              int(sizeof(T)) * Sm::kLdRows, L);
    }
    wgmma::wait<0>();
    hold_registers(aq);
    hold_registers(ay);
    hold_registers(dh);
  }

  __syncthreads();  // the last chunk's stores
  if (tid == 0 && c_end > c_first) publish_count(my_done, c_end - c_first);
  if (p.dinitial_state != nullptr) {
    store_state_slab(reinterpret_cast<float const(&)[16][4]>(dh), p.dinitial_state, state_off, 0, V, t);
  }
}

}  // namespace fusepack::gated_delta_bwd_detail
